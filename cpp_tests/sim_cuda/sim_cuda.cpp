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
//
// The simulator is split by concept (sim_cuda_internal.hpp lists the files and their layers). This
// file is the bottom layer: the settings, the simulator's state, what every entry point does first
// (count the call, trace it, inject a failure, need a context), the lazy setup, and the exit report
// and SIGSEGV handler that setup installs.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sim_cuda_internal.hpp"

namespace kvb_sim {

// ---- Settings -----------------------------------------------------------------------------------
[[noreturn]] void die(const std::string& message) {
    std::fprintf(stderr, "\nsim-cuda: %s\n", message.c_str());
    std::fflush(stderr);
    std::abort();
}

namespace {
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
}  // namespace

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

// ---- The simulator's state --------------------------------------------------------------------------
namespace {
// The device address range, for the SIGSEGV handler (which may not take the lock).
std::atomic<uint64_t> g_deviceBase{0}, g_deviceEnd{0};
}  // namespace

Sim& sim() {
    static Sim* s = new Sim;  // never destroyed: worker threads and exit handlers use it
    return *s;
}

thread_local std::vector<Context*> t_contexts;

// ---- Exit report, fault handler -----------------------------------------------------------------
namespace {
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
}  // namespace

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

// The calling thread's current context, or the error a call needing one returns.
CUresult currentContext(Sim& s, Context** out) {
    if (!s.cuInitDone) return kNotInitialized;
    if (t_contexts.empty() || t_contexts.back() == nullptr) return kInvalidContext;
    if (t_contexts.back()->refs <= 0) return kContextIsDestroyed;
    *out = t_contexts.back();
    return kSuccess;
}

}  // namespace kvb_sim
