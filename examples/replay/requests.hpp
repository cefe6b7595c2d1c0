// replay/requests.hpp: Requests of the replay, their counters and the per-step results.
#ifndef KVBLOCK_REPLAY_REQUESTS_HPP
#define KVBLOCK_REPLAY_REQUESTS_HPP

#include "common.hpp"
#include "options.hpp"
#include "timing.hpp"
#include "manager.hpp"

namespace replay {

// ---- requests and counters ---------------------------------------------------------------------

/// A trace request during the replay.
struct Req {
    uint64_t r = 0;  // trace index, also the manager's request id
    const TraceRequest* trace = nullptr;
    int32_t T = 1;                // tokens to generate
    std::vector<int32_t> tokens;  // prompt + generated so far (synthesised at first admission)
    int32_t generated = 0;
    int32_t input_length = 0;  // tokens given to the current admission
    int32_t context_pos = 0;   // engine: prompt tokens computed in the current admission
    bool in_prefill = false;   // engine: admitted, prompt not complete
    bool admitted_once = false;
    bool done = false;
    uint64_t admission_order = 0;  // engine: when it was last admitted (running order)
};

struct Counters {
    uint64_t steps = 0, admissions = 0, admission_failures = 0, preemptions = 0;
    uint64_t hit_blocks = 0, new_prompt_blocks = 0, admitted_blocks = 0;
    uint64_t decode_slots = 0, decode_new_blocks = 0, generated_tokens = 0, finished = 0;
    uint64_t prompt_tokens = 0, reused_prompt_tokens = 0;          // first admissions
    uint64_t prompt_tokens_all = 0, reused_prompt_tokens_all = 0;  // every admission
    uint64_t prefill_tokens = 0, prefill_chunks = 0;               // engine: computed prompt tokens
    uint64_t suspensions = 0, resumes = 0;                         // engine, max-utilization

    double hit_rate() const {
        return prompt_tokens
                   ? static_cast<double>(reused_prompt_tokens) / static_cast<double>(prompt_tokens)
                   : 0;
    }
};

/// Everything a loop produces.
struct RunResult {
    Counters c;
    Timings t;
    std::vector<uint64_t> step_ns;  // manager time of each step
    /// Admission time per admitted prompt block, for each step that admitted something.
    std::vector<uint64_t> block_ns;
    uint64_t blocks_before_step = 0;
    std::vector<replay::SeriesPoint> series;
    double loop_seconds = 0;

    /// Converts the timed figures, booked in ticks, to ns.
    void to_ns(double ns_per_tick) {
        auto conv = [ns_per_tick](uint64_t& v) {
            v = static_cast<uint64_t>(static_cast<double>(v) * ns_per_tick + 0.5);
        };
        for (uint64_t& v : t.ns) conv(v);
        for (uint64_t& v : step_ns) conv(v);
        for (uint64_t& v : block_ns) conv(v);
    }
};

inline kvb_request_t c_request(const Req& q) {
    kvb_request_t r;
    check(kvb_request_init(&r), "kvb_request_init");
    r.request_id = q.r;
    r.input_length = static_cast<int32_t>(q.tokens.size());
    r.tokens = q.tokens.data();
    r.num_tokens = q.tokens.size();
    return r;
}

/// Books an admission of `q` (its whole current sequence) with the manager's result.
inline void record_admission(Counters& c, Req& q, const kvb_admission_t& a, int32_t tpb) {
    const uint64_t n = q.tokens.size();
    q.input_length = static_cast<int32_t>(n);
    c.admissions += 1;
    c.hit_blocks += a.stats.reused_blocks;
    c.new_prompt_blocks += a.stats.missed_blocks;
    c.admitted_blocks += (n + static_cast<uint64_t>(tpb) - 1) / static_cast<uint64_t>(tpb);
    c.prompt_tokens_all += n;
    c.reused_prompt_tokens_all += static_cast<uint64_t>(a.prepopulated_prompt_len);
    if (!q.admitted_once) {
        q.admitted_once = true;
        c.prompt_tokens += n;
        c.reused_prompt_tokens += static_cast<uint64_t>(a.prepopulated_prompt_len);
    }
}

/// Appends the next generated token of `q`; true when the request has all its tokens.
inline bool sample(Counters& c, Req& q) {
    q.tokens.push_back(replay::output_token(q.r, q.tokens.size()));
    q.generated += 1;
    c.generated_tokens += 1;
    return q.generated >= q.T;
}

/// Samples one token for each of `sampled`; a request with all its tokens is released with its
/// blocks stored for reuse and leaves `running`.
inline void sample_and_release(RunResult& out, kvb_manager_t* m, const std::vector<Req*>& sampled,
                               std::vector<Req*>& running) {
    for (Req* q : sampled) {
        if (!sample(out.c, *q)) continue;
        check(timed(out.t, kFree, [&] { return kvb_manager_remove_sequence(m, q->r, true); }),
              "kvb_manager_remove_sequence");
        q->done = true;
        q->tokens = std::vector<int32_t>();
        out.c.finished += 1;
    }
    running.erase(std::remove_if(running.begin(), running.end(), [](Req* q) { return q->done; }),
                  running.end());
}

inline void finish_step(RunResult& out, kvb_manager_t* m, replay::Progress& progress) {
    out.step_ns.push_back(out.t.step_ns);
    out.t.step_ns = 0;
    const uint64_t blocks = out.c.admitted_blocks - out.blocks_before_step;
    if (blocks > 0) out.block_ns.push_back(out.t.step_admit_ns / blocks);
    out.blocks_before_step = out.c.admitted_blocks;
    out.t.step_admit_ns = 0;
    int64_t free_blocks = 0;
    check(kvb_manager_get_num_free_blocks(m, &free_blocks), "kvb_manager_get_num_free_blocks");
    out.series.push_back({out.c.steps, out.c.hit_rate(), free_blocks});
    progress.update(out.c.finished, out.c.steps, out.c.hit_rate());
}

}  // namespace replay

#endif  // KVBLOCK_REPLAY_REQUESTS_HPP
