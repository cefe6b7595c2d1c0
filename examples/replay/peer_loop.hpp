// replay/peer_loop.hpp: The peer loop (see replay.cpp): the peer replay workload's closed loop in vLLM v1's scheduler order.
#ifndef KVBLOCK_REPLAY_PEER_LOOP_HPP
#define KVBLOCK_REPLAY_PEER_LOOP_HPP

#include "common.hpp"
#include "options.hpp"
#include "timing.hpp"
#include "manager.hpp"
#include "requests.hpp"
#include "engine_loop.hpp"

namespace replay {

// ---- peer loop ------------------------------------------------------------------------------------

class PeerLoop {
  public:
    PeerLoop(const Options& o, kvb_manager_t* m, std::vector<Req>& reqs, replay::Progress& progress)
        : o_(o), m_(m), reqs_(reqs), progress_(progress) {}

    RunResult run() {
        auto start = Clock::now();
        TickCalibration calibration;
        for (Req& q : reqs_) waiting_.push_back(&q);
        Counters& c = out_.c;
        std::vector<Req*> scheduled;
        while (!waiting_.empty() || !running_.empty()) {
            c.steps += 1;
            scheduled.clear();
            bool preempted = false;
            // A. Decode.
            decode(scheduled, preempted);
            // B. Admission, whole requests, head-of-line blocking.
            if (!preempted) {
                while (!waiting_.empty() && running_.size() < static_cast<size_t>(o_.max_running)) {
                    Req* q = waiting_.front();
                    if (!admit(*q)) break;
                    waiting_.pop_front();
                    running_.push_back(q);
                    scheduled.push_back(q);
                }
            }
            // C. Sample; release finished requests.
            sample_and_release(out_, m_, scheduled, running_);
            if (o_.events) {
                check(timed(out_.t, kFlush, [&] { return kvb_manager_flush_iteration_events(m_); }),
                      "kvb_manager_flush_iteration_events");
            }
            finish_step(out_, m_, progress_);
        }
        out_.loop_seconds = std::chrono::duration<double>(Clock::now() - start).count();
        out_.to_ns(calibration.ns_per_tick());
        return std::move(out_);
    }

  private:
    /// Phase A in one kvb_manager_add_token_batch per step (add_token + store_new_block for every
    /// running request, in order). When the request at index i gets no block, the last running
    /// request is preempted and the batch goes on from i; if i itself was preempted, phase A
    /// stops. The same calls in the same order as one add_token + store_new_block per request.
    void decode(std::vector<Req*>& scheduled, bool& preempted) {
        size_t i = 0;
        while (i < running_.size()) {
            ids_.clear();
            tokens_.clear();
            for (size_t k = i; k < running_.size(); ++k) {
                ids_.push_back(running_[k]->r);
                tokens_.push_back(running_[k]->tokens.back());
            }
            size_t done = 0;
            kvb_status_t s = timed(out_.t, kDecodeAlloc, [&] {
                return kvb_manager_add_token_batch(m_, ids_.data(), tokens_.data(), ids_.size(),
                                                   true, nullptr, &done);
            });
            for (size_t k = i; k < i + done; ++k) {
                Req* q = running_[k];
                out_.c.decode_slots += 1;
                if ((q->tokens.size() - 1) % static_cast<size_t>(o_.tokens_per_block) == 0)
                    out_.c.decode_new_blocks += 1;
                scheduled.push_back(q);
            }
            i += done;
            if (s == KVB_OK) return;
            if (s != KVB_STATUS_OUT_OF_BLOCKS) check(s, "kvb_manager_add_token_batch");
            Req* q = running_[i];
            Req* victim = running_.back();
            running_.pop_back();
            check(timed(out_.t, kPreempt,
                        [&] { return kvb_manager_remove_sequence(m_, victim->r, true); }),
                  "kvb_manager_remove_sequence (preempt)");
            out_.c.preemptions += 1;
            waiting_.push_front(victim);
            preempted = true;
            if (victim == q) {
                out_.c.decode_slots += 1;  // its slot was requested
                return;
            }
        }
    }

    /// Admits q's whole current sequence and caches its full blocks; false when it does not fit.
    bool admit(Req& q) {
        if (q.tokens.empty()) q.tokens = replay::synthesize_prompt(*q.trace);
        const kvb_request_t r = c_request(q);
        kvb_admission_t a{};
        kvb_status_t s =
            timed(out_.t, kAdmitAlloc, [&] { return kvb_manager_add_sequence(m_, &r, &a); });
        if (s == KVB_STATUS_OUT_OF_BLOCKS) {
            out_.c.admission_failures += 1;
            if (running_.empty()) {
                throw std::runtime_error(
                    "request " + std::to_string(q.r) + " (" + std::to_string(q.tokens.size()) +
                    " tokens) does not fit in " + std::to_string(o_.primary_blocks) +
                    " primary blocks with nothing running: raise --primary-blocks");
            }
            return false;
        }
        check(s, "kvb_manager_add_sequence");
        record_admission(out_.c, q, a, o_.tokens_per_block);
        const int32_t n = r.input_length;
        check(timed(out_.t, kAdmitOther,
                    [&] { return kvb_manager_store_context_blocks(m_, q.r, n); }),
              "kvb_manager_store_context_blocks");
        return true;
    }

    const Options& o_;
    kvb_manager_t* m_;
    std::vector<Req>& reqs_;
    replay::Progress& progress_;
    std::deque<Req*> waiting_;
    std::vector<Req*> running_;
    std::vector<uint64_t> ids_;    // decode batch
    std::vector<int32_t> tokens_;  // decode batch
    RunResult out_;
};

}  // namespace replay

#endif  // KVBLOCK_REPLAY_PEER_LOOP_HPP
