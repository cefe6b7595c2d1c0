// A simulated CUDA driver (libcuda.so) for kvblock's tests: the driver entry points kvblock and its
// tests call, with the driver's semantics where kvblock depends on them, on a machine without a
// GPU. Built by the test build (cpp_tests/sim_cuda/CMakeLists.txt) as `libcuda.so` with that
// SONAME, and loaded in place of the real driver by dlopen()ing its absolute path before the first
// driver call (the tests do so when KVB_SIM_CUDA_LIBRARY names it): the dynamic loader then hands
// the already loaded object to anyone who asks for "libcuda.so" (cudarc's first candidate).
//
// What is simulated
// - Device memory: a PROT_NONE reservation gives the device addresses (a host dereference of one
//   faults, and the SIGSEGV handler names the allocation); the bytes live in a separate shadow
//   mapping that only the simulator touches. Pinned host memory (cuMemHostAlloc) is ordinary
//   memory with one address on both sides (unified addressing). cuPointerGetAttribute answers from
//   the allocation registry. Allocations past KVB_SIM_CUDA_MEMORY fail with OUT_OF_MEMORY.
// - One device (compute capability and SM count configurable), its primary context (retain,
//   release), a per-thread context stack (set, get, push, pop); calls that need a context fail
//   with CUDA_ERROR_INVALID_CONTEXT without one.
// - Streams are in-order queues, each run by its own worker thread; the legacy default stream
//   (handle 0 or CU_STREAM_LEGACY) waits for every blocking stream and they for it; events
//   (record, query, synchronize, cuStreamWaitEvent; a never-recorded event is complete).
// - cuModuleLoadData takes only a CUBIN: an ELF with e_machine 190 (EM_CUDA) for an architecture
//   the device runs (same major, minor not above the device's), and cuModuleGetFunction finds
//   names in its symbol table. cuLaunchKernel copies the arguments at launch and runs the real
//   kernels/block_copy.cu compiled for the CPU on the stream's worker, CTAs in shuffled order.
// - Every copy descriptor of a launch is checked (inside one live allocation, 16-byte aligned
//   where the vector path is taken, no destination overlapping a source or another destination
//   of the launch), and the descriptor buffer must hold the same bytes when the kernel runs as at
//   its launch. A violation aborts the process with a message naming the launch.
// - Ordering checks in the manner of PyTorch's CUDA sanitizer: vector clocks for the host, every
//   stream and every event; every launch's reads (descriptor buffer, source rows) and writes
//   (destination rows), every memcpy and memset, are checked at enqueue against the
//   happens-before of stream order, event record/wait, the legacy stream's implicit waits and host
//   waits. Host writes to pinned memory are seen when a later operation reads changed bytes (the
//   host must have waited for every earlier reader). A violation aborts naming both operations.
// - At exit, live allocations, streams, events and modules are reported; any makes the process
//   exit with status 1 (KVB_SIM_CUDA_LEAKS=report only reports).
//
// Settings (environment variables, read at the first driver call)
//   KVB_SIM_CUDA_MODE        eager (default): stream workers run work as soon as it is ready;
//                            delayed: each operation first sleeps a random time (seeded per
//                            stream, up to KVB_SIM_CUDA_DELAY_US, default 300 us);
//                            deferred: stream work runs only when the host waits for it
//                            (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize, synchronous
//                            copies, frees, a repeated query) or a stream that waits on it needs it, so
//                            a host read or a reuse before the proper ordering point sees stale
//                            bytes. The first cuEventQuery/cuStreamQuery of unfinished work runs
//                            nothing and answers NOT_READY; asked again (polling), it runs the work.
//   KVB_SIM_CUDA_SEED        seed of the delays and of the CTA order (default 1).
//   KVB_SIM_CUDA_MEMORY      device memory in bytes (default 2 GiB; suffixes K, M, G).
//   KVB_SIM_CUDA_HOST_MEMORY pinned host memory limit in bytes (default: unlimited).
//   KVB_SIM_CUDA_VERSION     what cuDriverGetVersion answers (default 13000; e.g. 12040).
//   KVB_SIM_CUDA_ARCH        compute capability as major*10+minor (default 90).
//   KVB_SIM_CUDA_SMS         multiprocessor count (default 132).
//   KVB_SIM_CUDA_FAIL        fault injection: "cuMemAlloc_v2:3,cuLaunchKernel:1:719" fails the 3rd
//                            call of cuMemAlloc_v2 (OUT_OF_MEMORY for allocating and creating calls,
//                            CUDA_ERROR_UNKNOWN otherwise, or the code given third) and the 1st
//                            cuLaunchKernel with 719. kvb_sim_cuda_fail() does the same at run time;
//                            kvb_sim_cuda_calls() counts a function's calls and
//                            kvb_sim_cuda_live_objects() the live allocations, streams, events and
//                            modules.
//   KVB_SIM_CUDA_ORDERING    off: no happens-before checks (to see what a mode alone exposes).
//   KVB_SIM_CUDA_LEAKS       fail (default) or report.
//   KVB_SIM_CUDA_TRACE       1: log every simulated call to stderr.
//
// Functions of the CUDA 13.0 driver API that are not simulated are exported as stubs returning
// CUDA_ERROR_NOT_SUPPORTED (sim_cuda_stubs.inc, generated by gen_stubs.py from cudarc's list),
// because cudarc 0.18 resolves every one of them when it loads the library. Built with
// KVB_SIM_CUDA_12040_SYMBOLS, only the symbols of a CUDA 12.4 driver are exported.
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

// ---- The copy kernel, compiled for the CPU ------------------------------------------------------
namespace kvbk {
struct uint4 {
    unsigned int x, y, z, w;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
// Per worker thread: several streams run kernels at once.
thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#include "../../kernels/block_copy.cu"
#undef __global__
#undef __device__
#undef __forceinline__
}  // namespace kvbk

#define KVB_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;

// Result codes (cuda.h).
constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3,
                   kInvalidDevice = 101, kInvalidImage = 200, kInvalidContext = 201,
                   kNoBinaryForGpu = 209, kInvalidHandle = 400, kNotFound = 500, kNotReady = 600,
                   kContextIsDestroyed = 709, kNotSupported = 801, kUnknown = 999;

struct ErrorText {
    CUresult code;
    const char* name;
    const char* text;
};
const ErrorText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

// ---- Settings -----------------------------------------------------------------------------------
enum class Mode { Eager, Delayed, Deferred };

[[noreturn]] void die(const std::string& message) {
    std::fprintf(stderr, "\nsim-cuda: %s\n", message.c_str());
    std::fflush(stderr);
    std::abort();
}

uint64_t parseBytes(const char* s, const char* var) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(s, &end, 10);
    switch (end && *end ? *end : ' ') {
        case 'K':
        case 'k':
            v <<= 10;
            ++end;
            break;
        case 'M':
        case 'm':
            v <<= 20;
            ++end;
            break;
        case 'G':
        case 'g':
            v <<= 30;
            ++end;
            break;
        default:
            break;
    }
    if (end == s || (end && *end)) die(std::string(var) + "=" + s + ": not a size in bytes");
    return v;
}

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

const Config& config() {
    static const Config c = [] {
        Config c;
#ifdef KVB_SIM_CUDA_12040_SYMBOLS
        c.version = 12040;
#endif
        if (const char* m = std::getenv("KVB_SIM_CUDA_MODE")) {
            std::string s = m;
            if (s == "eager" || s.empty()) {
                c.mode = Mode::Eager;
            } else if (s == "delayed") {
                c.mode = Mode::Delayed;
            } else if (s == "deferred") {
                c.mode = Mode::Deferred;
            } else {
                die("KVB_SIM_CUDA_MODE=" + s + ": eager, delayed or deferred");
            }
        }
        if (const char* s = std::getenv("KVB_SIM_CUDA_SEED"))
            c.seed = std::strtoull(s, nullptr, 10);
        if (const char* s = std::getenv("KVB_SIM_CUDA_DELAY_US"))
            c.delayUs = std::strtoull(s, nullptr, 10);
        if (const char* s = std::getenv("KVB_SIM_CUDA_MEMORY"))
            c.memory = parseBytes(s, "KVB_SIM_CUDA_MEMORY");
        if (const char* s = std::getenv("KVB_SIM_CUDA_HOST_MEMORY"))
            c.hostMemory = parseBytes(s, "KVB_SIM_CUDA_HOST_MEMORY");
        if (const char* s = std::getenv("KVB_SIM_CUDA_VERSION")) c.version = std::atoi(s);
        if (const char* s = std::getenv("KVB_SIM_CUDA_ARCH")) c.arch = std::atoi(s);
        if (const char* s = std::getenv("KVB_SIM_CUDA_SMS")) c.sms = std::atoi(s);
        if (const char* s = std::getenv("KVB_SIM_CUDA_LEAKS"))
            c.leaksFail = std::string(s) != "report";
        if (const char* s = std::getenv("KVB_SIM_CUDA_TRACE")) c.trace = std::string(s) == "1";
        if (const char* s = std::getenv("KVB_SIM_CUDA_ORDERING"))
            c.ordering = std::string(s) != "off";
        if (c.arch < 10 || c.sms < 1) die("KVB_SIM_CUDA_ARCH / KVB_SIM_CUDA_SMS out of range");
        c.memory = (c.memory + 0xfff) & ~0xfffull;
        return c;
    }();
    return c;
}

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

bool happensBefore(const Access& a, const Clock& c) {
    return a.seq == 0 || c.get(a.actor) >= a.seq;
}

// ---- Memory ------------------------------------------------------------------------------------------
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

std::atomic<uint64_t> g_deviceBase{0}, g_deviceEnd{0};

Sim& sim() {
    static Sim* s = new Sim;  // never destroyed: worker threads and exit handlers use it
    return *s;
}

thread_local std::vector<Context*> t_contexts;

// ---- Calls, fault injection, tracing ------------------------------------------------------------
void parseFailRules(const char* spec, std::vector<FailRule>& out,
                    const std::map<std::string, uint64_t>& calls) {
    std::string s = spec;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t comma = s.find(',', pos);
        std::string item =
            s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? s.size() : comma + 1;
        if (item.empty()) continue;
        size_t c1 = item.find(':');
        if (c1 == std::string::npos)
            die("KVB_SIM_CUDA_FAIL: \"" + item + "\" is not name:N[:code]");
        size_t c2 = item.find(':', c1 + 1);
        FailRule r;
        r.name = item.substr(0, c1);
        uint64_t n = std::strtoull(item.substr(c1 + 1, c2 - c1 - 1).c_str(), nullptr, 10);
        if (n == 0) die("KVB_SIM_CUDA_FAIL: \"" + item + "\": calls count from 1");
        auto it = calls.find(r.name);
        r.nth = n + (it == calls.end() ? 0 : it->second);
        bool allocating = r.name.find("Alloc") != std::string::npos ||
                          r.name.find("Create") != std::string::npos ||
                          r.name.find("Retain") != std::string::npos ||
                          r.name.find("Load") != std::string::npos;
        r.code = c2 == std::string::npos ? (allocating ? kOutOfMemory : kUnknown)
                                         : std::atoi(item.c_str() + c2 + 1);
        out.push_back(r);
    }
}

void atExit();
void installSegvHandler();

// Lazily sets up the simulator (at the first call of any entry point).
void initOnce(Sim& s) {
    if (s.initialized) return;
    const Config& c = config();
    s.initialized = true;
    // The device address space: inaccessible from the host. The bytes live in the shadow.
    void* va = mmap(nullptr, c.memory + (64ull << 20), PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* sh = mmap(nullptr, c.memory, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (va == MAP_FAILED || sh == MAP_FAILED) die("cannot reserve the simulated device memory");
    // Device addresses start 2 MiB aligned, away from 0.
    s.deviceBase = (reinterpret_cast<uint64_t>(va) + (2ull << 20) - 1) & ~((2ull << 20) - 1);
    s.shadow = static_cast<uint8_t*>(sh);
    s.freeRanges[0] = c.memory;
    g_deviceBase = s.deviceBase;
    g_deviceEnd = s.deviceBase + c.memory;
    if (const char* f = std::getenv("KVB_SIM_CUDA_FAIL")) parseFailRules(f, s.failRules, s.calls);
    std::atexit(atExit);
    installSegvHandler();
    const char* modes[] = {"eager", "delayed", "deferred"};
    std::fprintf(stderr,
                 "sim-cuda: simulated CUDA driver %d.%d, sm_%d with %d SMs, %llu MiB, %s mode, "
                 "seed %llu\n",
                 c.version / 1000, c.version % 1000 / 10, c.arch, c.sms,
                 (unsigned long long)(c.memory >> 20), modes[static_cast<int>(c.mode)],
                 (unsigned long long)c.seed);
}

// Counts a call of `name` and says whether fault injection fails it (with `code`).
bool injected(Sim& s, const char* name, CUresult& code) {
    uint64_t n = ++s.calls[name];
    if (config().trace)
        std::fprintf(stderr, "sim-cuda: %s (call %llu)\n", name, (unsigned long long)n);
    for (auto& r : s.failRules) {
        if (r.nth == n && r.name == name) {
            code = r.code;
            std::fprintf(stderr, "sim-cuda: injected failure: call %llu of %s returns %d\n",
                         (unsigned long long)n, name, code);
            return true;
        }
    }
    return false;
}

// Common prologue: takes the lock, counts the call, applies fault injection.
#define ENTER(name)                                                 \
    Sim& s = sim();                                                 \
    std::unique_lock<std::mutex> lock(s.mu);                        \
    initOnce(s);                                                    \
    {                                                               \
        CUresult injected_code = 0;                                 \
        if (injected(s, name, injected_code)) return injected_code; \
    }

// The calling thread's current context, or the error a call needing one returns.
CUresult currentContext(Sim& s, Context** out) {
    if (!s.cuInitDone) return kNotInitialized;
    if (t_contexts.empty() || t_contexts.back() == nullptr) return kInvalidContext;
    if (t_contexts.back()->refs <= 0) return kContextIsDestroyed;
    *out = t_contexts.back();
    return kSuccess;
}

#define NEED_CONTEXT()                                                    \
    Context* ctx = nullptr;                                               \
    if (CUresult rc = currentContext(s, &ctx); rc != kSuccess) return rc; \
    (void)ctx;

// ---- Allocation registry -------------------------------------------------------------------------
const Allocation* findAllocation(Sim& s, uint64_t addr, uint64_t len) {
    auto it = s.allocations.upper_bound(addr);
    if (it == s.allocations.begin()) return nullptr;
    --it;
    const Allocation& a = it->second;
    if (addr < a.base || addr - a.base >= std::max<uint64_t>(a.size, 1)) return nullptr;
    if (len > a.size - (addr - a.base)) return nullptr;
    return &a;
}

// Where the simulator reads and writes `addr` (device memory lives in the shadow).
uint8_t* view(Sim& s, const Allocation& a, uint64_t addr) {
    if (a.kind == Kind::Pinned) return reinterpret_cast<uint8_t*>(addr);
    return s.shadow + (addr - s.deviceBase);
}

std::string describeAddress(Sim& s, uint64_t addr) {
    char b[64];
    std::snprintf(b, sizeof b, "0x%llx", (unsigned long long)addr);
    std::string out = b;
    if (const Allocation* a = findAllocation(s, addr, 0)) {
        out += " (offset " + std::to_string(addr - a->base) + " of " + a->describe() + ")";
    } else if (addr >= s.deviceBase && addr < s.deviceBase + config().memory) {
        out += " (simulated device memory, in no live allocation)";
    } else {
        out += " (in no allocation of this driver)";
    }
    return out;
}

// ---- Happens-before tracking -----------------------------------------------------------------------
void splitAt(Sim& s, uint64_t at) {
    auto it = s.segments.upper_bound(at);
    if (it == s.segments.begin()) return;
    --it;
    if (it->first == at || it->second.end <= at) return;
    Segment tail = it->second;
    if (!tail.snapshot.empty()) {
        size_t cut = static_cast<size_t>(at - it->first);
        tail.snapshot.assign(it->second.snapshot.begin() + static_cast<long>(cut),
                             it->second.snapshot.end());
        it->second.snapshot.resize(cut);
    }
    it->second.end = at;
    s.segments.emplace(at, std::move(tail));
}

[[noreturn]] void orderingViolation(const std::string& who, const char* verb, uint64_t lo,
                                    uint64_t hi, const Access& other, const char* otherVerb,
                                    Sim& s) {
    char range[64];
    std::snprintf(range, sizeof range, "[0x%llx, 0x%llx)", (unsigned long long)lo,
                  (unsigned long long)hi);
    die("ordering violation: " + who + " " + verb + " " + range + " at " + describeAddress(s, lo) +
        ", which " + *other.what + " " + otherVerb +
        ", and nothing orders the two (no stream order, event record/wait or host "
        "synchronization between them)");
}

// Records an access of [lo, hi) by `who` (whose clock is `clock`) and checks it against every
// earlier access it conflicts with. `pinnedView`, for pinned memory read by the device, is the
// memory itself: a change since the last device read is a host write the host must have ordered.
void track(Sim& s, uint64_t lo, uint64_t hi, bool write, const Access& who, const Clock& clock,
           const uint8_t* pinnedView) {
    if (lo >= hi || !config().ordering) return;
    // Fill the gaps with empty segments, then split at the ends.
    splitAt(s, lo);
    splitAt(s, hi);
    {
        uint64_t at = lo;
        auto it = s.segments.lower_bound(lo);
        std::vector<std::pair<uint64_t, uint64_t>> gaps;
        while (at < hi) {
            if (it == s.segments.end() || it->first >= hi) {
                gaps.push_back({at, hi});
                break;
            }
            if (it->first > at) gaps.push_back({at, it->first});
            at = it->second.end;
            ++it;
        }
        for (auto& g : gaps) s.segments[g.first].end = g.second;
    }
    for (auto it = s.segments.lower_bound(lo); it != s.segments.end() && it->first < hi; ++it) {
        Segment& seg = it->second;
        if (pinnedView && !seg.snapshot.empty() &&
            std::memcmp(seg.snapshot.data(), pinnedView + (it->first - lo), seg.snapshot.size()) !=
                0) {
            // The host rewrote these bytes since a device operation read them: it must have
            // waited for every earlier access first.
            Access hostWrite{0, 0,
                             std::make_shared<const std::string>(
                                 "the host (rewriting pinned memory before " + *who.what + ")")};
            for (const Access& r : seg.reads) {
                if (!happensBefore(r, s.host)) {
                    orderingViolation("the host (seen when " + *who.what + " was enqueued)",
                                      "rewrote pinned memory", it->first, seg.end, r,
                                      "reads (enqueued earlier, not known finished by the host)",
                                      s);
                }
            }
            if (!happensBefore(seg.write, s.host)) {
                orderingViolation("the host", "rewrote pinned memory", it->first, seg.end,
                                  seg.write, "writes", s);
            }
            hostWrite.seq = s.host.get(0);
            seg.write = hostWrite;
            seg.reads.clear();
        }
        if (!happensBefore(seg.write, clock)) {
            orderingViolation(*who.what, write ? "writes" : "reads", it->first, seg.end, seg.write,
                              "writes", s);
        }
        if (write) {
            for (const Access& r : seg.reads) {
                if (r.actor != who.actor && !happensBefore(r, clock)) {
                    orderingViolation(*who.what, "writes", it->first, seg.end, r, "reads", s);
                }
            }
            seg.write = who;
            seg.reads.clear();
            seg.snapshot.clear();
        } else {
            bool replaced = false;
            for (Access& r : seg.reads) {
                if (r.actor == who.actor) {
                    r = who;
                    replaced = true;
                }
            }
            if (!replaced) seg.reads.push_back(who);
            // Pinned bytes last written by the host (or never by the device): remember them.
            if (pinnedView && seg.write.actor == 0) {
                const uint8_t* p = pinnedView + (it->first - lo);
                seg.snapshot.assign(p, p + (seg.end - it->first));
            }
        }
    }
    // A write leaves one segment.
    if (write) {
        Segment merged;
        merged.end = hi;
        merged.write = who;
        auto first = s.segments.lower_bound(lo);
        auto last = s.segments.lower_bound(hi);
        s.segments.erase(first, last);
        s.segments.emplace(lo, std::move(merged));
    }
}

// Forgets [lo, hi) (freed memory).
void untrack(Sim& s, uint64_t lo, uint64_t hi) {
    splitAt(s, lo);
    splitAt(s, hi);
    s.segments.erase(s.segments.lower_bound(lo), s.segments.lower_bound(hi));
}

// Tracks an access to [addr, addr + len) of an allocation (pinned memory gets its view).
void trackRange(Sim& s, const Allocation& a, uint64_t addr, uint64_t len, bool write,
                const Access& who, const Clock& clock) {
    const uint8_t* pinned = a.kind == Kind::Pinned && !write ? view(s, a, addr) : nullptr;
    track(s, addr, addr + len, write, who, clock, pinned);
}

// ---- Streams ------------------------------------------------------------------------------------------
void demand(Sim& s, Stream* st, uint64_t seq) {
    if (seq > st->allowed) {
        st->allowed = seq;
        s.cv.notify_all();
    }
}

void workerLoop(std::shared_ptr<Stream> st) {
    Sim& s = sim();
    std::unique_lock<std::mutex> lock(s.mu);
    const Config& c = config();
    for (;;) {
        s.cv.wait(lock, [&] {
            return s.shutdown || (!st->queue.empty() && st->queue.front().seq <= st->allowed) ||
                   (st->destroyed && st->queue.empty());
        });
        if (s.shutdown || st->queue.empty()) return;
        Op op = std::move(st->queue.front());
        st->queue.pop_front();
        if (op.waitFor) {
            Stream* other = op.waitFor.get();
            if (c.mode == Mode::Deferred) demand(s, other, op.waitSeq);
            s.cv.wait(lock, [&] { return s.shutdown || other->completed >= op.waitSeq; });
            if (s.shutdown) return;
        }
        if (op.run) {
            if (c.mode == Mode::Delayed) {
                uint64_t us = st->rng() % (c.delayUs + 1);
                if (st->rng() % 2 == 0) us = 0;  // half the operations run at once
                lock.unlock();
                std::this_thread::sleep_for(std::chrono::microseconds(us));
                op.run();
                lock.lock();
            } else {
                lock.unlock();
                op.run();
                lock.lock();
            }
        }
        st->completed = op.seq;
        s.cv.notify_all();
    }
}

std::shared_ptr<Stream> newStream(Sim& s, Context* ctx, unsigned flags, bool legacy) {
    auto st = std::make_shared<Stream>();
    st->actor = s.nextActor++;
    st->id = legacy ? 0 : s.nextStream++;
    st->flags = flags;
    st->legacy = legacy;
    st->ctx = ctx;
    st->allowed = config().mode == Mode::Deferred ? 0 : ~0ull;
    st->rng.seed(config().seed * 0x9e3779b97f4a7c15ull + st->actor);
    st->worker = std::thread(workerLoop, st);
    s.allStreams.push_back(st);
    return st;
}

Stream* legacyStream(Sim& s, Context* ctx) {
    if (!ctx->legacyStream) ctx->legacyStream = newStream(s, ctx, 0, true);
    return ctx->legacyStream.get();
}

constexpr uintptr_t kStreamLegacy = 0x1, kStreamPerThread = 0x2;
constexpr unsigned kNonBlocking = 0x1;

// The stream behind a handle (0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the legacy stream).
CUresult resolveStream(Sim& s, Context* ctx, void* handle, Stream** out) {
    auto h = reinterpret_cast<uintptr_t>(handle);
    if (h == 0 || h == kStreamLegacy || h == kStreamPerThread) {
        *out = legacyStream(s, ctx);
        return kSuccess;
    }
    auto it = s.streams.find(static_cast<Stream*>(handle));
    if (it == s.streams.end()) return kInvalidHandle;
    *out = it->first;
    return kSuccess;
}

std::shared_ptr<Stream> shared(Sim& s, Stream* st) {
    for (auto& p : s.allStreams)
        if (p.get() == st) return p;
    return nullptr;
}

void pushWait(Sim& s, Stream* st, Stream* other, uint64_t seq, const Clock& clock) {
    if (seq == 0 || other == st) return;
    uint64_t& w = st->waited[other];
    st->clock.join(clock);
    if (seq <= w) return;
    w = seq;
    Op op;
    op.seq = ++st->enqueued;
    op.waitFor = shared(s, other);
    op.waitSeq = seq;
    st->clock.set(st->actor, st->enqueued);
    st->queue.push_back(std::move(op));
    s.cv.notify_all();
}

// Adds the legacy stream's implicit ordering before work enqueued on `st`, and returns the clock
// and position the new operation will have (call `enqueue` right after).
void implicitWaits(Sim& s, Stream* st) {
    if (st->legacy) {
        for (auto& [p, sp] : s.streams) {
            if (sp->ctx == st->ctx && !(sp->flags & kNonBlocking))
                pushWait(s, st, p, sp->enqueued, sp->clock);
        }
    } else if (!(st->flags & kNonBlocking)) {
        Stream* l = legacyStream(s, st->ctx);
        pushWait(s, st, l, l->enqueued, l->clock);
    }
}

// Opens a new operation on `st`: its access (actor, position) and clock.
Access beginOp(Sim& s, Stream* st, const std::string& what, Clock& clock) {
    implicitWaits(s, st);
    // The enqueue is a host event: host writes the simulator infers at this operation (see
    // `track`) carry its host time, so they are ordered before the operation and nothing later.
    s.host.set(0, s.host.get(0) + 1);
    st->clock.join(s.host);
    st->clock.set(st->actor, st->enqueued + 1);
    clock = st->clock;
    return Access{st->actor, st->enqueued + 1,
                  std::make_shared<const std::string>(what + " on " + st->label())};
}

void enqueue(Sim& s, Stream* st, std::function<void()> run) {
    Op op;
    op.seq = ++st->enqueued;
    op.run = std::move(run);
    st->clock.set(st->actor, st->enqueued);
    st->queue.push_back(std::move(op));
    s.cv.notify_all();
}

// The host waits until `st` completed `seq` (running it first in deferred mode).
void hostWait(Sim& s, std::unique_lock<std::mutex>& lock, Stream* st, uint64_t seq) {
    if (st->completed >= seq) return;
    demand(s, st, seq);
    s.cv.wait(lock, [&] { return st->completed >= seq; });
}

void synchronizeAll(Sim& s, std::unique_lock<std::mutex>& lock) {
    for (auto& st : s.allStreams) {
        hostWait(s, lock, st.get(), st->enqueued);
        s.host.join(st->clock);
    }
}

// ---- Exit report, fault handler -----------------------------------------------------------------
void atExit() {
    Sim& s = sim();
    std::vector<std::string> leaks;
    {
        std::unique_lock<std::mutex> lock(s.mu);
        s.shutdown = true;
        s.cv.notify_all();
        for (auto& [p, a] : s.allocations) leaks.push_back(a.describe());
        for (auto& [p, st] : s.streams) leaks.push_back(st->label() + " (cuStreamCreate)");
        for (auto& [p, e] : s.events) leaks.push_back("event #" + std::to_string(e->id));
        for (auto& [p, m] : s.modules) leaks.push_back("module #" + std::to_string(m->id));
    }
    for (auto& st : s.allStreams)
        if (st->worker.joinable()) st->worker.join();
    if (leaks.empty()) return;
    std::fprintf(stderr, "\nsim-cuda: %zu CUDA object(s) still live at exit (leaked):\n",
                 leaks.size());
    for (auto& l : leaks) std::fprintf(stderr, "sim-cuda:   %s\n", l.c_str());
    std::fflush(nullptr);
    if (config().leaksFail) _exit(1);
}

struct sigaction g_previousSegv;

void writeAll(const char* p) {
    size_t n = std::strlen(p);
    while (n > 0) {
        ssize_t w = write(2, p, n);
        if (w <= 0) return;
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void onSegv(int sig, siginfo_t* info, void* uctx) {
    auto addr = reinterpret_cast<uint64_t>(info->si_addr);
    if (addr >= g_deviceBase.load() && addr < g_deviceEnd.load() + (64ull << 20)) {
        char hex[32];
        int i = 31;
        hex[i] = 0;
        do {
            hex[--i] = "0123456789abcdef"[addr & 0xf];
            addr >>= 4;
        } while (addr && i > 2);
        writeAll("\nsim-cuda: the host dereferenced simulated device address 0x");
        writeAll(hex + i);
        writeAll(": GPU memory is not host-accessible (copy it with cuMemcpyDtoH)\n");
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    if (g_previousSegv.sa_flags & SA_SIGINFO) {
        g_previousSegv.sa_sigaction(sig, info, uctx);
    } else if (g_previousSegv.sa_handler == SIG_DFL || g_previousSegv.sa_handler == SIG_IGN) {
        sigaction(SIGSEGV, &g_previousSegv, nullptr);  // the fault recurs and takes its course
    } else {
        g_previousSegv.sa_handler(sig);
    }
}

void installSegvHandler() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = onSegv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previousSegv);
}

// ---- The copy kernel's launches -----------------------------------------------------------------
using Descriptor = kvbk::kvb_copy_descriptor;
static_assert(sizeof(Descriptor) == 40, "the layout of src/cuda/plan.rs");

struct Interval {
    uint64_t lo, hi;
    bool write;
    unsigned copy;
};

// Checks the descriptors of a launch; fills `intervals` with every chunk read and written.
void checkDescriptors(Sim& s, const std::string& launch, const Descriptor* d, unsigned n,
                      std::vector<Interval>& intervals) {
    intervals.clear();
    for (unsigned i = 0; i < n; ++i) {
        const Descriptor& c = d[i];
        std::string which = launch + ", descriptor " + std::to_string(i);
        if (c.num_chunks == 0 || c.chunk_bytes == 0) continue;
        if (c.num_chunks > 1 && c.chunk_stride < c.chunk_bytes)
            die(which + ": chunks of " + std::to_string(c.chunk_bytes) + " bytes overlap (stride " +
                std::to_string(c.chunk_stride) + ")");
        uint64_t span = (uint64_t(c.num_chunks) - 1) * c.chunk_stride + c.chunk_bytes;
        for (int side = 0; side < 2; ++side) {
            uint64_t base = side ? c.dst : c.src;
            if (!findAllocation(s, base, span)) {
                const Allocation* a = findAllocation(s, base, 0);
                die(which + ": the " + (side ? "destination" : "source") + " [" +
                    describeAddress(s, base) + ", +" + std::to_string(span) + " bytes) is " +
                    (a ? "not inside its allocation" : "in no live allocation"));
            }
        }
        if ((c.flags & 1u) && ((c.src | c.dst | c.chunk_bytes | c.chunk_stride) % 16) != 0)
            die(which +
                ": the vector path (flags bit 0) with an address or size that is not a "
                "multiple of 16 bytes (src " +
                describeAddress(s, c.src) + ", dst " + describeAddress(s, c.dst) + ", chunk " +
                std::to_string(c.chunk_bytes) + ", stride " + std::to_string(c.chunk_stride) +
                "): a misaligned access on the GPU");
        for (unsigned k = 0; k < c.num_chunks; ++k) {
            uint64_t off = uint64_t(k) * c.chunk_stride;
            intervals.push_back({c.src + off, c.src + off + c.chunk_bytes, false, i});
            intervals.push_back({c.dst + off, c.dst + off + c.chunk_bytes, true, i});
        }
    }
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval& a, const Interval& b) { return a.lo < b.lo; });
    const Interval* maxWrite = nullptr;
    const Interval* maxRead = nullptr;
    for (const Interval& iv : intervals) {
        const Interval* clash = nullptr;
        if (maxWrite && maxWrite->hi > iv.lo) clash = maxWrite;
        if (!clash && iv.write && maxRead && maxRead->hi > iv.lo) clash = maxRead;
        if (clash) {
            die(launch + ": descriptor " + std::to_string(iv.copy) + " " +
                (iv.write ? "writes" : "reads") + " " + describeAddress(s, iv.lo) +
                ", which descriptor " + std::to_string(clash->copy) + " " +
                (clash->write ? "writes" : "reads") +
                " in the same launch: CTAs run in no order, so a destination may not overlap a "
                "source or another destination");
        }
        const Interval*& m = iv.write ? maxWrite : maxRead;
        if (!m || iv.hi > m->hi) m = &iv;
    }
}

void runKernel(const Descriptor* d, unsigned num, unsigned slices, unsigned grid, unsigned block,
               uint64_t seed) {
    std::vector<unsigned> order(grid);
    for (unsigned i = 0; i < grid; ++i) order[i] = i;
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    kvbk::gridDim = kvbk::dim3{grid, 1, 1};
    kvbk::blockDim = kvbk::dim3{block, 1, 1};
    for (unsigned b : order) {
        kvbk::blockIdx = kvbk::dim3{b, 0, 0};
        for (unsigned t = 0; t < block; ++t) {
            kvbk::threadIdx = kvbk::dim3{t, 0, 0};
            kvbk::kvb_copy_blocks(d, num, slices);
        }
    }
}

// ---- ELF (CUBIN) parsing ------------------------------------------------------------------------------
template <typename T>
T rd(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

CUresult parseCubin(const uint8_t* img, std::set<std::string>& symbols, std::string& why) {
    if (!img) return kInvalidValue;
    if (std::memcmp(img,
                    "\x7f"
                    "ELF",
                    4) != 0) {
        why = "not an ELF image (a CUBIN is one; PTX and fatbins are not simulated)";
        return kInvalidImage;
    }
    if (img[4] != 2 || img[5] != 1) {
        why = "not a 64-bit little-endian ELF";
        return kInvalidImage;
    }
    uint16_t machine = rd<uint16_t>(img + 18);
    if (machine != 190) {
        why = "ELF for machine " + std::to_string(machine) + ", not EM_CUDA (190)";
        return kInvalidImage;
    }
    uint32_t flags = rd<uint32_t>(img + 48);
    int arch = img[8] >= 8 ? static_cast<int>((flags >> 8) & 0xff) : static_cast<int>(flags & 0xff);
    int dev = config().arch;
    if (arch / 10 != dev / 10 || arch % 10 > dev % 10) {
        why =
            "a CUBIN for sm_" + std::to_string(arch) + " does not run on sm_" + std::to_string(dev);
        return kNoBinaryForGpu;
    }
    uint64_t shoff = rd<uint64_t>(img + 40);
    uint16_t shentsize = rd<uint16_t>(img + 58), shnum = rd<uint16_t>(img + 60);
    if (shoff == 0 || shentsize != 64 || shnum == 0 || shnum > 4096 || shoff > (64u << 20)) {
        why = "no usable section headers";
        return kInvalidImage;
    }
    for (unsigned i = 0; i < shnum; ++i) {
        const uint8_t* sh = img + shoff + uint64_t(i) * 64;
        if (rd<uint32_t>(sh + 4) != 2 /* SHT_SYMTAB */) continue;
        uint64_t off = rd<uint64_t>(sh + 24), size = rd<uint64_t>(sh + 32);
        uint32_t link = rd<uint32_t>(sh + 40);
        if (link >= shnum || size > (64u << 20)) break;
        const uint8_t* strsh = img + shoff + uint64_t(link) * 64;
        const char* strtab = reinterpret_cast<const char*>(img + rd<uint64_t>(strsh + 24));
        uint64_t strsize = rd<uint64_t>(strsh + 32);
        for (uint64_t k = 0; k + 24 <= size; k += 24) {
            uint32_t name = rd<uint32_t>(img + off + k);
            if (name > 0 && name < strsize)
                symbols.insert(std::string(strtab + name, strnlen(strtab + name, strsize - name)));
        }
    }
    if (symbols.empty()) {
        why = "the ELF has no symbol table";
        return kInvalidImage;
    }
    return kSuccess;
}

}  // namespace

// =================================================================================================
// The driver API
// =================================================================================================
using CUcontext = Context*;
using CUstream = void*;
using CUevent = void*;
using CUmodule = void*;
using CUfunction = void*;

KVB_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
    if (!pStr) return kInvalidValue;
    for (const ErrorText& e : kErrors) {
        if (e.code == error) {
            *pStr = e.name;
            return kSuccess;
        }
    }
    *pStr = nullptr;
    return kInvalidValue;
}

KVB_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
    if (!pStr) return kInvalidValue;
    for (const ErrorText& e : kErrors) {
        if (e.code == error) {
            *pStr = e.text;
            return kSuccess;
        }
    }
    *pStr = nullptr;
    return kInvalidValue;
}

KVB_EXPORT CUresult cuDriverGetVersion(int* version) {
    if (!version) return kInvalidValue;
    *version = config().version;
    return kSuccess;
}

KVB_EXPORT CUresult cuInit(unsigned flags) {
    ENTER("cuInit");
    if (flags != 0) return kInvalidValue;
    s.cuInitDone = true;
    return kSuccess;
}

#define NEED_INIT() \
    if (!s.cuInitDone) return kNotInitialized;

KVB_EXPORT CUresult cuDeviceGetCount(int* count) {
    ENTER("cuDeviceGetCount");
    NEED_INIT();
    if (!count) return kInvalidValue;
    *count = 1;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    ENTER("cuDeviceGet");
    NEED_INIT();
    if (!device) return kInvalidValue;
    if (ordinal != 0) return kInvalidDevice;
    *device = 0;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    ENTER("cuDeviceGetName");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!name || len <= 0) return kInvalidValue;
    std::snprintf(name, static_cast<size_t>(len), "kvblock simulated GPU (sm_%d)", config().arch);
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    ENTER("cuDeviceTotalMem_v2");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!bytes) return kInvalidValue;
    *bytes = config().memory;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGetAttribute(int* value, int attrib, CUdevice dev) {
    ENTER("cuDeviceGetAttribute");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!value || attrib <= 0 || attrib > 200) return kInvalidValue;
    const Config& c = config();
    switch (attrib) {
        case 1:
            *value = 1024;
            break;  // MAX_THREADS_PER_BLOCK
        case 2:
        case 3:
            *value = 1024;
            break;  // MAX_BLOCK_DIM_X/Y
        case 4:
            *value = 64;
            break;  // MAX_BLOCK_DIM_Z
        case 5:
            *value = 2147483647;
            break;  // MAX_GRID_DIM_X
        case 6:
        case 7:
            *value = 65535;
            break;  // MAX_GRID_DIM_Y/Z
        case 8:
            *value = 48 * 1024;
            break;  // MAX_SHARED_MEMORY_PER_BLOCK
        case 10:
            *value = 32;
            break;  // WARP_SIZE
        case 16:
            *value = c.sms;
            break;  // MULTIPROCESSOR_COUNT
        case 19:
            *value = 1;
            break;  // CAN_MAP_HOST_MEMORY
        case 41:
            *value = 1;
            break;  // UNIFIED_ADDRESSING
        case 75:
            *value = c.arch / 10;
            break;  // COMPUTE_CAPABILITY_MAJOR
        case 76:
            *value = c.arch % 10;
            break;  // COMPUTE_CAPABILITY_MINOR
        default:
            *value = 0;
            break;
    }
    return kSuccess;
}

KVB_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
    ENTER("cuDevicePrimaryCtxRetain");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!pctx) return kInvalidValue;
    ++s.primary.refs;
    *pctx = &s.primary;
    return kSuccess;
}

KVB_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER("cuDevicePrimaryCtxRelease_v2");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (s.primary.refs <= 0) return kInvalidContext;
    --s.primary.refs;
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER("cuCtxSetCurrent");
    NEED_INIT();
    if (ctx && ctx != &s.primary) return kInvalidContext;
    if (ctx == nullptr) {
        if (!t_contexts.empty()) t_contexts.pop_back();
    } else if (t_contexts.empty()) {
        t_contexts.push_back(ctx);
    } else {
        t_contexts.back() = ctx;
    }
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
    ENTER("cuCtxGetCurrent");
    NEED_INIT();
    if (!pctx) return kInvalidValue;
    *pctx = t_contexts.empty() ? nullptr : t_contexts.back();
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    ENTER("cuCtxPushCurrent_v2");
    NEED_INIT();
    if (ctx != &s.primary) return kInvalidContext;
    t_contexts.push_back(ctx);
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
    ENTER("cuCtxPopCurrent_v2");
    NEED_INIT();
    if (t_contexts.empty()) return kInvalidContext;
    if (pctx) *pctx = t_contexts.back();
    t_contexts.pop_back();
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxSynchronize() {
    ENTER("cuCtxSynchronize");
    NEED_CONTEXT();
    synchronizeAll(s, lock);
    return kSuccess;
}

// ---- Memory --------------------------------------------------------------------------------------------
KVB_EXPORT CUresult cuMemGetInfo_v2(size_t* freeBytes, size_t* totalBytes) {
    ENTER("cuMemGetInfo_v2");
    NEED_CONTEXT();
    if (!freeBytes || !totalBytes) return kInvalidValue;
    *totalBytes = config().memory;
    *freeBytes = config().memory - s.deviceUsed;
    return kSuccess;
}

KVB_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
    ENTER("cuMemAlloc_v2");
    NEED_CONTEXT();
    if (!dptr || bytes == 0) return kInvalidValue;
    // Page granularity, and a guard page so neighbours are never adjacent.
    uint64_t need = ((bytes + 0xfff) & ~0xfffull) + 0x1000;
    for (auto it = s.freeRanges.begin(); it != s.freeRanges.end(); ++it) {
        if (it->second < need) continue;
        uint64_t off = it->first, left = it->second - need;
        s.freeRanges.erase(it);
        if (left) s.freeRanges[off + need] = left;
        Allocation a;
        a.kind = Kind::Device;
        a.base = s.deviceBase + off;
        a.size = bytes;
        a.reserved = need;
        a.id = s.nextAllocation++;
        a.origin = "cuMemAlloc_v2";
        // Fresh memory holds garbage on a GPU: small allocations get a pattern (large ones stay
        // zero, which costs nothing).
        if (bytes <= (1u << 20)) std::memset(s.shadow + off, 0xcd, bytes);
        s.deviceUsed += need;
        s.allocations[a.base] = a;
        *dptr = a.base;
        return kSuccess;
    }
    return kOutOfMemory;
}

KVB_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER("cuMemFree_v2");
    NEED_CONTEXT();
    if (dptr == 0) return kSuccess;
    auto it = s.allocations.find(dptr);
    if (it == s.allocations.end() || it->second.kind != Kind::Device) return kInvalidValue;
    // Like the driver, freeing waits for the device's work first.
    synchronizeAll(s, lock);
    it = s.allocations.find(dptr);
    if (it == s.allocations.end()) return kInvalidValue;
    Allocation a = it->second;
    s.allocations.erase(it);
    uint64_t off = a.base - s.deviceBase;
    madvise(s.shadow + off, a.reserved, MADV_DONTNEED);
    untrack(s, a.base, a.base + a.size);
    s.deviceUsed -= a.reserved;
    // Give the range back, merging with its neighbours.
    uint64_t lo = off, size = a.reserved;
    auto next = s.freeRanges.lower_bound(lo);
    if (next != s.freeRanges.end() && next->first == lo + size) {
        size += next->second;
        next = s.freeRanges.erase(next);
    }
    if (next != s.freeRanges.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == lo) {
            prev->second += size;
            return kSuccess;
        }
    }
    s.freeRanges[lo] = size;
    return kSuccess;
}

constexpr unsigned kHostAllocFlags = 0x1 | 0x2 | 0x4;  // PORTABLE | DEVICEMAP | WRITECOMBINED

KVB_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned flags) {
    ENTER("cuMemHostAlloc");
    NEED_CONTEXT();
    if (!pp || bytes == 0 || (flags & ~kHostAllocFlags)) return kInvalidValue;
    uint64_t need = (bytes + 0xfff) & ~0xfffull;
    if (need > config().hostMemory - std::min(config().hostMemory, s.hostUsed)) return kOutOfMemory;
    void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return kOutOfMemory;
    Allocation a;
    a.kind = Kind::Pinned;
    a.base = reinterpret_cast<uint64_t>(p);
    a.size = bytes;
    a.reserved = need;
    a.id = s.nextAllocation++;
    a.origin = "cuMemHostAlloc";
    s.hostUsed += need;
    s.allocations[a.base] = a;
    *pp = p;
    return kSuccess;
}

KVB_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytes) {
    // (cuMemHostAlloc with no flags.)
    return cuMemHostAlloc(pp, bytes, 0);
}

KVB_EXPORT CUresult cuMemFreeHost(void* p) {
    ENTER("cuMemFreeHost");
    NEED_CONTEXT();
    auto it = s.allocations.find(reinterpret_cast<uint64_t>(p));
    if (!p || it == s.allocations.end() || it->second.kind != Kind::Pinned) return kInvalidValue;
    synchronizeAll(s, lock);
    it = s.allocations.find(reinterpret_cast<uint64_t>(p));
    if (it == s.allocations.end()) return kInvalidValue;
    Allocation a = it->second;
    s.allocations.erase(it);
    untrack(s, a.base, a.base + a.size);
    s.hostUsed -= a.reserved;
    munmap(p, a.reserved);
    return kSuccess;
}

KVB_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned flags) {
    ENTER("cuMemHostGetDevicePointer_v2");
    NEED_CONTEXT();
    if (!dptr || flags != 0) return kInvalidValue;
    const Allocation* a = findAllocation(s, reinterpret_cast<uint64_t>(p), 0);
    if (!a || a->kind != Kind::Pinned) return kInvalidValue;
    *dptr = reinterpret_cast<uint64_t>(p);  // unified addressing: the same address
    return kSuccess;
}

KVB_EXPORT CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
    ENTER("cuPointerGetAttribute");
    NEED_INIT();
    if (!data) return kInvalidValue;
    const Allocation* a = findAllocation(s, ptr, 0);
    if (!a) return kInvalidValue;  // pageable host memory, or nothing
    switch (attribute) {
        case 1:
            *static_cast<CUcontext*>(data) = &s.primary;
            break;  // CONTEXT
        case 2:
            *static_cast<unsigned*>(data) = a->kind == Kind::Device ? 2 : 1;
            break;  // TYPE
        case 3:
            *static_cast<CUdeviceptr*>(data) = ptr;
            break;  // DEVICE_POINTER
        case 4:     // HOST_POINTER
            if (a->kind == Kind::Device) return kInvalidValue;
            *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
            break;
        case 8:
            *static_cast<unsigned*>(data) = 0;
            break;  // IS_MANAGED
        case 9:
            *static_cast<int*>(data) = 0;
            break;  // DEVICE_ORDINAL
        case 11:
            *static_cast<CUdeviceptr*>(data) = a->base;
            break;  // RANGE_START_ADDR
        case 12:
            *static_cast<size_t*>(data) = a->size;
            break;  // RANGE_SIZE
        case 13:
            *static_cast<unsigned*>(data) = 1;
            break;  // MAPPED
        default:
            return kInvalidValue;
    }
    return kSuccess;
}

// ---- Copies and sets --------------------------------------------------------------------------------
namespace {

// A device-visible range: device memory, or pinned host memory (unified addressing).
const Allocation* deviceRange(Sim& s, uint64_t addr, uint64_t len) {
    return findAllocation(s, addr, std::max<uint64_t>(len, 1));
}

enum class Copy { HtoD, DtoH };

// Enqueues a copy between host memory `host` and device-visible `dev` on `st`; `sync`: the host
// waits for it (a synchronous copy, or an async one to pageable memory).
CUresult copyOp(Sim& s, std::unique_lock<std::mutex>& lock, Stream* st, Copy dir, void* host,
                uint64_t dev, size_t bytes, bool syncCall, const char* name) {
    if (bytes == 0) return kSuccess;
    if (!host) return kInvalidValue;
    const Allocation* d = deviceRange(s, dev, bytes);
    if (!d) return kInvalidValue;
    const Allocation* h = findAllocation(s, reinterpret_cast<uint64_t>(host), bytes);
    if (h && h->kind != Kind::Pinned) h = nullptr;
    std::string what = std::string(name) + " #" + std::to_string(s.nextOp++) + " of " +
                       std::to_string(bytes) + " bytes";
    Clock clock;
    Access who = beginOp(s, st, what, clock);
    trackRange(s, *d, dev, bytes, dir == Copy::HtoD, who, clock);
    if (h)
        trackRange(s, *h, reinterpret_cast<uint64_t>(host), bytes, dir == Copy::DtoH, who, clock);
    uint8_t* dv = view(s, *d, dev);
    bool pageable = h == nullptr;
    if (dir == Copy::HtoD) {
        // Pageable sources are staged at the call (the driver's behaviour); pinned ones are read
        // when the copy runs, and must not have changed since the call.
        auto staged = std::make_shared<std::vector<uint8_t>>(
            static_cast<const uint8_t*>(host), static_cast<const uint8_t*>(host) + bytes);
        const uint8_t* src = static_cast<const uint8_t*>(host);
        auto desc = who.what;
        enqueue(s, st, [=] {
            if (!pageable && std::memcmp(src, staged->data(), bytes) != 0)
                die("the source of " + *desc +
                    " (pinned host memory) was modified between the call and the copy: the host "
                    "must wait for the copy (stream or event synchronization) before reusing it");
            std::memcpy(dv, staged->data(), bytes);
        });
    } else {
        uint8_t* dstp = static_cast<uint8_t*>(host);
        enqueue(s, st, [=] { std::memcpy(dstp, dv, bytes); });
    }
    if (syncCall || (pageable && dir == Copy::DtoH)) {
        uint64_t seq = st->enqueued;
        hostWait(s, lock, st, seq);
        s.host.join(clock);
    }
    return kSuccess;
}

}  // namespace

KVB_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes,
                                         CUstream hStream) {
    ENTER("cuMemcpyHtoDAsync_v2");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    return copyOp(s, lock, st, Copy::HtoD, const_cast<void*>(src), dst, bytes, false,
                  "cuMemcpyHtoDAsync");
}

KVB_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes,
                                         CUstream hStream) {
    ENTER("cuMemcpyDtoHAsync_v2");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    return copyOp(s, lock, st, Copy::DtoH, dst, src, bytes, false, "cuMemcpyDtoHAsync");
}

KVB_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    ENTER("cuMemcpyHtoD_v2");
    NEED_CONTEXT();
    return copyOp(s, lock, legacyStream(s, ctx), Copy::HtoD, const_cast<void*>(src), dst, bytes,
                  true, "cuMemcpyHtoD");
}

KVB_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    ENTER("cuMemcpyDtoH_v2");
    NEED_CONTEXT();
    return copyOp(s, lock, legacyStream(s, ctx), Copy::DtoH, dst, src, bytes, true, "cuMemcpyDtoH");
}

namespace {
CUresult memsetOp(Sim& s, std::unique_lock<std::mutex>& lock, Stream* st, uint64_t dst,
                  unsigned char value, size_t bytes, bool syncCall) {
    if (bytes == 0) return kSuccess;
    const Allocation* d = deviceRange(s, dst, bytes);
    if (!d) return kInvalidValue;
    Clock clock;
    Access who = beginOp(
        s, st,
        "cuMemsetD8 #" + std::to_string(s.nextOp++) + " of " + std::to_string(bytes) + " bytes",
        clock);
    trackRange(s, *d, dst, bytes, true, who, clock);
    uint8_t* p = view(s, *d, dst);
    enqueue(s, st, [=] { std::memset(p, value, bytes); });
    if (syncCall) {
        hostWait(s, lock, st, st->enqueued);
        s.host.join(clock);
    }
    return kSuccess;
}
}  // namespace

KVB_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                    CUstream hStream) {
    ENTER("cuMemsetD8Async");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    return memsetOp(s, lock, st, dst, value, n, false);
}

KVB_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    ENTER("cuMemsetD8_v2");
    NEED_CONTEXT();
    return memsetOp(s, lock, legacyStream(s, ctx), dst, value, n, true);
}

// ---- Streams and events ------------------------------------------------------------------------------
KVB_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned flags) {
    ENTER("cuStreamCreate");
    NEED_CONTEXT();
    if (!phStream || (flags & ~kNonBlocking)) return kInvalidValue;
    auto st = newStream(s, ctx, flags, false);
    s.streams[st.get()] = st;
    *phStream = st.get();
    return kSuccess;
}

KVB_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    ENTER("cuStreamDestroy_v2");
    NEED_CONTEXT();
    auto it = s.streams.find(static_cast<Stream*>(hStream));
    if (it == s.streams.end()) return kInvalidHandle;
    // Work already enqueued still runs (the driver releases the stream once it is done).
    Stream* st = it->first;
    st->destroyed = true;
    demand(s, st, st->enqueued);
    s.streams.erase(it);
    s.cv.notify_all();
    return kSuccess;
}

KVB_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
    ENTER("cuStreamSynchronize");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    if (st->legacy) implicitWaits(s, st);  // the legacy stream waits for the blocking streams
    hostWait(s, lock, st, st->enqueued);
    s.host.join(st->clock);
    return kSuccess;
}

KVB_EXPORT CUresult cuStreamQuery(CUstream hStream) {
    ENTER("cuStreamQuery");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    // Deferred: as cuEventQuery, a second query of the same work runs it.
    if (st->completed < st->enqueued && config().mode == Mode::Deferred &&
        st->queried == st->enqueued)
        hostWait(s, lock, st, st->enqueued);
    if (st->completed >= st->enqueued) {
        s.host.join(st->clock);
        return kSuccess;
    }
    st->queried = st->enqueued;
    return kNotReady;
}

KVB_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned flags) {
    ENTER("cuEventCreate");
    NEED_CONTEXT();
    if (!phEvent || (flags & ~0xfu)) return kInvalidValue;
    auto e = std::make_unique<Event>();
    e->id = s.nextEvent++;
    Event* p = e.get();
    s.events[p] = std::move(e);
    *phEvent = p;
    return kSuccess;
}

KVB_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
    ENTER("cuEventDestroy_v2");
    NEED_CONTEXT();
    if (s.events.erase(static_cast<Event*>(hEvent)) == 0) return kInvalidHandle;
    return kSuccess;
}

KVB_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    ENTER("cuEventRecord");
    NEED_CONTEXT();
    auto it = s.events.find(static_cast<Event*>(hEvent));
    if (it == s.events.end()) return kInvalidHandle;
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    implicitWaits(s, st);
    Event& e = *it->second;
    e.stream = shared(s, st);
    e.seq = st->enqueued;
    st->clock.join(s.host);
    e.clock = st->clock;
    return kSuccess;
}

namespace {
bool eventDone(const Event& e) {
    return !e.stream || e.stream->completed >= e.seq;
}
}  // namespace

KVB_EXPORT CUresult cuEventQuery(CUevent hEvent) {
    ENTER("cuEventQuery");
    NEED_CONTEXT();
    auto it = s.events.find(static_cast<Event*>(hEvent));
    if (it == s.events.end()) return kInvalidHandle;
    Event& e = *it->second;
    // Deferred: the first query of a record answers NOT_READY and runs nothing; a second one (a
    // polling loop) runs the work and answers SUCCESS.
    if (!eventDone(e) && config().mode == Mode::Deferred && e.queried == e.seq)
        hostWait(s, lock, e.stream.get(), e.seq);
    if (eventDone(e)) {
        s.host.join(e.clock);
        return kSuccess;
    }
    e.queried = e.seq;
    return kNotReady;
}

KVB_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
    ENTER("cuEventSynchronize");
    NEED_CONTEXT();
    auto it = s.events.find(static_cast<Event*>(hEvent));
    if (it == s.events.end()) return kInvalidHandle;
    Event& e = *it->second;
    if (e.stream) hostWait(s, lock, e.stream.get(), e.seq);
    s.host.join(e.clock);
    return kSuccess;
}

KVB_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned flags) {
    ENTER("cuStreamWaitEvent");
    NEED_CONTEXT();
    if (flags != 0) return kInvalidValue;
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    auto it = s.events.find(static_cast<Event*>(hEvent));
    if (it == s.events.end()) return kInvalidHandle;
    Event& e = *it->second;
    if (!e.stream) return kSuccess;  // never recorded: nothing to wait for
    pushWait(s, st, e.stream.get(), e.seq, e.clock);
    return kSuccess;
}

// ---- Modules and launches ------------------------------------------------------------------------------
KVB_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    ENTER("cuModuleLoadData");
    NEED_CONTEXT();
    if (!module || !image) return kInvalidValue;
    auto m = std::make_unique<Module>();
    std::string why;
    CUresult rc = parseCubin(static_cast<const uint8_t*>(image), m->symbols, why);
    if (rc != kSuccess) {
        std::fprintf(stderr, "sim-cuda: cuModuleLoadData refuses the image: %s\n", why.c_str());
        return rc;
    }
    m->id = s.nextModule++;
    Module* p = m.get();
    s.modules[p] = std::move(m);
    *module = p;
    return kSuccess;
}

KVB_EXPORT CUresult cuModuleUnload(CUmodule module) {
    ENTER("cuModuleUnload");
    NEED_CONTEXT();
    if (s.modules.erase(static_cast<Module*>(module)) == 0) return kInvalidHandle;
    return kSuccess;
}

KVB_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule module, const char* name) {
    ENTER("cuModuleGetFunction");
    NEED_CONTEXT();
    if (!hfunc || !name) return kInvalidValue;
    auto it = s.modules.find(static_cast<Module*>(module));
    if (it == s.modules.end()) return kInvalidHandle;
    Module& m = *it->second;
    if (!m.symbols.count(name)) return kNotFound;
    if (std::string(name) != "kvb_copy_blocks") {
        std::fprintf(stderr, "sim-cuda: kernel %s is not simulated (only kvb_copy_blocks)\n", name);
        return kNotFound;
    }
    m.functions.push_back({&m, name});
    *hfunc = &m.functions.back();
    return kSuccess;
}

KVB_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ,
                                   unsigned blockX, unsigned blockY, unsigned blockZ,
                                   unsigned sharedMem, CUstream hStream, void** kernelParams,
                                   void** extra) {
    ENTER("cuLaunchKernel");
    NEED_CONTEXT();
    auto* fn = static_cast<std::pair<Module*, std::string>*>(f);
    bool live = false;
    for (auto& [p, m] : s.modules) {
        for (auto& g : m->functions) live = live || &g == fn;
    }
    if (!fn || !live) return kInvalidHandle;
    if (!gridX || !gridY || !gridZ || !blockX || !blockY || !blockZ) return kInvalidValue;
    if (uint64_t(blockX) * blockY * blockZ > 1024 || sharedMem > 48 * 1024) return kInvalidValue;
    if (gridY != 1 || gridZ != 1 || blockY != 1 || blockZ != 1) return kNotSupported;
    if (!kernelParams || extra) return kInvalidValue;
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    // The arguments are copied now (the caller's variables may change right after).
    uint64_t descriptors = *static_cast<const uint64_t*>(kernelParams[0]);
    unsigned num = *static_cast<const unsigned*>(kernelParams[1]);
    unsigned slices = *static_cast<const unsigned*>(kernelParams[2]);
    uint64_t launchId = s.nextLaunch++;
    char name[200];
    std::snprintf(name, sizeof name,
                  "launch #%llu (kvb_copy_blocks<<<%u, %u>>>, %u copies, %u slices each)",
                  (unsigned long long)launchId, gridX, blockX, num, slices);
    Clock clock;
    Access who = beginOp(s, st, name, clock);
    const std::string launch = *who.what;
    if (num == 0) {
        enqueue(s, st, nullptr);
        return kSuccess;
    }
    if (slices == 0) die(launch + ": slices_per_copy is 0 (the kernel divides by it)");
    uint64_t bytes = uint64_t(num) * sizeof(Descriptor);
    const Allocation* buf = deviceRange(s, descriptors, bytes);
    if (!buf || descriptors % 8 != 0)
        die(launch + ": the descriptor buffer [" + describeAddress(s, descriptors) + ", +" +
            std::to_string(bytes) + " bytes) is " +
            (buf ? "not 8-byte aligned" : "not inside one live allocation"));
    bool pinned = buf->kind == Kind::Pinned;
    // Descriptors in pinned memory (kvblock's case) are read and checked now, in launch order,
    // and again when the kernel runs; device-resident ones only when it runs.
    auto atLaunch = std::make_shared<std::vector<Descriptor>>(num);
    std::vector<Interval> intervals;
    if (pinned) {
        std::memcpy(atLaunch->data(), view(s, *buf, descriptors), bytes);
        trackRange(s, *buf, descriptors, bytes, false, who, clock);
        checkDescriptors(s, launch, atLaunch->data(), num, intervals);
        for (const Interval& iv : intervals) {
            const Allocation* a = findAllocation(s, iv.lo, iv.hi - iv.lo);
            trackRange(s, *a, iv.lo, iv.hi - iv.lo, iv.write, who, clock);
        }
    }
    uint64_t seed = config().seed * 0x2545f4914f6cdd1dull + launchId;
    enqueue(s, st, [=] {
        Sim& sm = sim();
        std::vector<Descriptor> d(num);
        {
            std::lock_guard<std::mutex> g(sm.mu);
            const Allocation* b = deviceRange(sm, descriptors, bytes);
            if (!b)
                die(launch + ": its descriptor buffer was freed before the kernel ran (" +
                    describeAddress(sm, descriptors) + ")");
            std::memcpy(d.data(), view(sm, *b, descriptors), bytes);
            if (pinned && std::memcmp(d.data(), atLaunch->data(), bytes) != 0) {
                unsigned i = 0;
                while (i + 1 < num && std::memcmp(&d[i], &(*atLaunch)[i], sizeof(Descriptor)) == 0)
                    ++i;
                die(launch + ": its descriptor buffer (" + describeAddress(sm, descriptors) +
                    ") was rewritten between the launch and the kernel's execution (descriptor " +
                    std::to_string(i) +
                    " first): the host reused it before the launch's completion event");
            }
            std::vector<Interval> ivs;
            checkDescriptors(sm, launch, d.data(), num, ivs);
            // The kernel runs on the simulator's view of the memory.
            for (Descriptor& c : d) {
                if (c.num_chunks == 0 || c.chunk_bytes == 0) continue;
                c.src = reinterpret_cast<uint64_t>(view(sm, *findAllocation(sm, c.src, 0), c.src));
                c.dst = reinterpret_cast<uint64_t>(view(sm, *findAllocation(sm, c.dst, 0), c.dst));
            }
        }
        runKernel(d.data(), num, slices, gridX, blockX, seed);
    });
    return kSuccess;
}

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

// ---- Everything else of the driver API: stubs ----------------------------------------------------------
namespace {
CUresult notSimulated(const char* name) {
    std::fprintf(stderr, "sim-cuda: %s is not simulated (CUDA_ERROR_NOT_SUPPORTED)\n", name);
    return kNotSupported;
}
}  // namespace

#define KVB_SIM_STUB(name)          \
    KVB_EXPORT CUresult name() {    \
        return notSimulated(#name); \
    }
#define KVB_SIM_STUB_12040(name) KVB_SIM_STUB(name)
#ifdef KVB_SIM_CUDA_12040_SYMBOLS
#define KVB_SIM_STUB_13000(name)
#else
#define KVB_SIM_STUB_13000(name) KVB_SIM_STUB(name)
#endif
#include "sim_cuda_stubs.inc"
