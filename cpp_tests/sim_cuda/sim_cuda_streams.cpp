// Streams and events. A stream is an in-order queue run by its own worker thread; the three
// scheduling modes (KVB_SIM_CUDA_MODE) differ only in when a worker may run an operation: eager at
// once, delayed after a random sleep, deferred only once the host or another stream demands it.
// The legacy default stream's implicit waits and the vector clocks that the ordering checks read
// are kept here too, as they change exactly when work is enqueued or waited for.
#include <chrono>
#include <cstdint>

#include "sim_cuda_internal.hpp"

namespace kvb_sim {

// ---- Streams ------------------------------------------------------------------------------------------
namespace {
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
}  // namespace

Stream* legacyStream(Sim& s, Context* ctx) {
    if (!ctx->legacyStream) ctx->legacyStream = newStream(s, ctx, 0, true);
    return ctx->legacyStream.get();
}

namespace {
constexpr uintptr_t kStreamLegacy = 0x1, kStreamPerThread = 0x2;
constexpr unsigned kNonBlocking = 0x1;
}  // namespace

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

namespace {
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

}  // namespace

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

}  // namespace kvb_sim

using namespace kvb_sim;

// ---- Entry points: streams and events ------------------------------------------------------------------
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
