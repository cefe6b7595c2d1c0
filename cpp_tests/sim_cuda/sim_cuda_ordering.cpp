// The allocation registry's lookups and the happens-before checks on allocations' bytes. Below
// the streams: an operation's access is checked when it is enqueued, with the clock the stream
// layer gave it, so this file needs only the state and never a stream.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "sim_cuda_internal.hpp"

namespace kvb_sim {

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

// A device-visible range: device memory, or pinned host memory (unified addressing).
const Allocation* deviceRange(Sim& s, uint64_t addr, uint64_t len) {
    return findAllocation(s, addr, std::max<uint64_t>(len, 1));
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
namespace {
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
}  // namespace

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

}  // namespace kvb_sim
