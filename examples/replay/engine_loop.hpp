// replay/engine_loop.hpp: The engine loop (see replay.cpp): decode, chunked prefill, batched admission, preemption or suspension.
#ifndef KVBLOCK_REPLAY_ENGINE_LOOP_HPP
#define KVBLOCK_REPLAY_ENGINE_LOOP_HPP

#include "common.hpp"
#include "options.hpp"
#include "timing.hpp"
#include "manager.hpp"
#include "requests.hpp"

namespace replay {

// ---- engine loop ----------------------------------------------------------------------------------

class EngineLoop {
  public:
    EngineLoop(const Options& o, kvb_manager_t* m, std::vector<Req>& reqs,
               replay::Progress& progress)
        : o_(o), m_(m), reqs_(reqs), progress_(progress) {}

    RunResult run() {
        auto start = Clock::now();
        TickCalibration calibration;
        size_t next_arrival = 0;
        const double t0_ms = reqs_.front().trace->timestamp_ms;
        if (!o_.realtime) {
            for (Req& q : reqs_) waiting_.push_back(&q);
            next_arrival = reqs_.size();
        }
        while (out_.c.finished < reqs_.size()) {
            if (o_.realtime) {
                double now_ms =
                    std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                while (next_arrival < reqs_.size() &&
                       reqs_[next_arrival].trace->timestamp_ms - t0_ms <= now_ms) {
                    waiting_.push_back(&reqs_[next_arrival++]);
                }
                if (waiting_.empty() && running_.empty()) {  // idle until the next arrival
                    double wait = reqs_[next_arrival].trace->timestamp_ms - t0_ms - now_ms;
                    std::this_thread::sleep_for(
                        std::chrono::duration<double, std::milli>(std::min(wait, 100.0)));
                    continue;
                }
            }
            step();
        }
        out_.loop_seconds = std::chrono::duration<double>(Clock::now() - start).count();
        out_.to_ns(calibration.ns_per_tick());
        return std::move(out_);
    }

  private:
    void step() {
        Counters& c = out_.c;
        c.steps += 1;
        int64_t budget = o_.token_budget;
        bool preempted = false;
        std::vector<Req*> decoding;                    // got a KV slot for their last token
        std::vector<std::pair<Req*, int32_t>> chunks;  // prefill chunks of this step
        const bool max_utilization = o_.scheduler == Scheduler::MaxUtilization;

        // 0. (max-utilization) Resume suspended requests, oldest admission first.
        if (max_utilization) resume_suspended();
        size_t decode_attempts = 0;
        // 1. Decode: one KV slot per generating request, preempting (or suspending) from the back
        //    when full.
        for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
            Req* q = running_[i];
            if (q->in_prefill) continue;
            c.decode_slots += 1;
            decode_attempts += 1;
            const bool got =
                max_utilization ? reserve_decode_slot(*q, preempted) : decode_slot(*q, preempted);
            if (!got) break;  // q itself was preempted or suspended
            decoding.push_back(q);
            budget -= 1;
        }
        // 2. Continuing prefills, in admission order.
        for (Req* q : running_) {
            if (q->in_prefill && budget > 0) budget -= plan_chunk(*q, budget, chunks);
        }
        // 3. Admission of new requests, one batch, FCFS (suspended requests come first).
        if (!preempted && suspended_.empty() && budget > 0) admit(budget, chunks);
        // 4. Per-iteration hook, before the forward pass.
        check(timed(out_.t, kRefresh, [&] { return kvb_manager_refresh_blocks(m_); }),
              "kvb_manager_refresh_blocks");
        // (The forward pass would run here.)
        // 5. Store the blocks each chunk completed; a completed prompt samples its first token.
        std::vector<Req*> sampling = decoding;
        for (auto& [q, n] : chunks) {
            q->context_pos += n;
            c.prefill_tokens += static_cast<uint64_t>(n);
            c.prefill_chunks += 1;
            check(timed(out_.t, kAdmitOther,
                        [&] { return kvb_manager_store_context_blocks(m_, q->r, q->context_pos); }),
                  "kvb_manager_store_context_blocks");
            if (q->context_pos == q->input_length) {
                q->in_prefill = false;
                sampling.push_back(q);
            }
        }
        // 6. Sample; release finished requests, storing their blocks for reuse.
        sample_and_release(out_, m_, sampling, running_);
        // 7. End of the iteration's events (the drainer thread picks them up).
        check(timed(out_.t, kFlush, [&] { return kvb_manager_flush_iteration_events(m_); }),
              "kvb_manager_flush_iteration_events");
        if (max_utilization) {
            // Requests that wanted to generate: those that tried for a slot, and the suspended.
            const size_t generation = decode_attempts + suspended_.size();
            check(timed(out_.t, kRefresh,
                        [&] {
                            return kvb_manager_end_scheduling_pass(m_, generation,
                                                                   decoding.size() + chunks.size());
                        }),
                  "kvb_manager_end_scheduling_pass");
        }
        finish_step(out_, m_, progress_);
    }

    /// max-utilization: reserves q's decode slot with allocate_generation, suspending the most
    /// recently admitted running request while it cannot be had, then adds the token (which
    /// cannot run out of blocks now). False when q itself was suspended.
    bool reserve_decode_slot(Req& q, bool& suspended) {
        while (true) {
            bool allocated = false;
            check(timed(out_.t, kDecodeAlloc,
                        [&] { return kvb_manager_allocate_generation(m_, q.r, 0, &allocated); }),
                  "kvb_manager_allocate_generation");
            if (allocated) break;
            Req* victim = running_.back();
            running_.pop_back();
            suspend(*victim);
            suspended = true;
            if (victim == &q) return false;
        }
        const int32_t token = q.tokens.back();
        check(timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_add_token(m_, q.r, token); }),
              "kvb_manager_add_token");
        if ((q.tokens.size() - 1) % static_cast<size_t>(o_.tokens_per_block) == 0)
            out_.c.decode_new_blocks += 1;
        check(timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_store_new_block(m_, q.r); }),
              "kvb_manager_store_new_block");
        return true;
    }

    /// Suspends a running request: it keeps its blocks (they may move to the host tier) and its
    /// progress, and waits in admission order to be resumed.
    void suspend(Req& v) {
        check(timed(out_.t, kPreempt, [&] { return kvb_manager_suspend(m_, v.r); }),
              "kvb_manager_suspend");
        auto at = std::upper_bound(
            suspended_.begin(), suspended_.end(), &v,
            [](const Req* a, const Req* b) { return a->admission_order < b->admission_order; });
        suspended_.insert(at, &v);
        out_.c.suspensions += 1;
    }

    /// Resumes suspended requests, oldest admission first, while a running slot is free and the
    /// manager takes them back (it refuses above its utilization threshold or without room).
    void resume_suspended() {
        while (!suspended_.empty() && running_.size() < static_cast<size_t>(o_.max_running)) {
            Req* q = suspended_.front();
            bool resumed = false;
            check(timed(out_.t, kPreempt, [&] { return kvb_manager_resume(m_, q->r, &resumed); }),
                  "kvb_manager_resume");
            if (!resumed) return;
            suspended_.erase(suspended_.begin());
            auto at = std::upper_bound(
                running_.begin(), running_.end(), q,
                [](const Req* a, const Req* b) { return a->admission_order < b->admission_order; });
            running_.insert(at, q);
            out_.c.resumes += 1;
        }
    }

    /// add_token for q's last token (+ store_new_block). On OUT_OF_BLOCKS preempts the last
    /// running request and retries; false when q itself was preempted.
    bool decode_slot(Req& q, bool& preempted) {
        const int32_t token = q.tokens.back();
        while (true) {
            kvb_status_t s =
                timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_add_token(m_, q.r, token); });
            if (s == KVB_OK) break;
            if (s != KVB_STATUS_OUT_OF_BLOCKS) check(s, "kvb_manager_add_token");
            Req* victim = running_.back();
            running_.pop_back();
            preempt(*victim);
            preempted = true;
            if (victim == &q) return false;
        }
        // The manager now holds KV slots for every token of q; a new block opened when the
        // last one landed at a block boundary.
        if ((q.tokens.size() - 1) % static_cast<size_t>(o_.tokens_per_block) == 0)
            out_.c.decode_new_blocks += 1;
        check(timed(out_.t, kDecodeAlloc, [&] { return kvb_manager_store_new_block(m_, q.r); }),
              "kvb_manager_store_new_block");
        return true;
    }

    /// Releases a running request and puts it back at the head of the waiting queue. Its KV is
    /// stored for reuse only when its prompt was complete (all tokens but the last computed).
    void preempt(Req& v) {
        const bool store = !v.in_prefill;
        check(timed(out_.t, kPreempt, [&] { return kvb_manager_remove_sequence(m_, v.r, store); }),
              "kvb_manager_remove_sequence (preempt)");
        v.in_prefill = false;
        v.context_pos = 0;
        out_.c.preemptions += 1;
        waiting_.push_front(&v);
    }

    int64_t plan_chunk(Req& q, int64_t budget, std::vector<std::pair<Req*, int32_t>>& chunks) {
        int32_t n = static_cast<int32_t>(std::min<int64_t>(budget, q.input_length - q.context_pos));
        if (n > 0) chunks.emplace_back(&q, n);
        return n;
    }

    void admit(int64_t& budget, std::vector<std::pair<Req*, int32_t>>& chunks) {
        // Candidates: the head of the queue while a running slot is free and their full prompts
        // have not yet reserved the budget (the first candidate always has a chunk).
        std::vector<kvb_request_t> batch;
        int64_t reserved = 0;
        for (size_t k = 0;
             k < waiting_.size() && running_.size() + k < static_cast<size_t>(o_.max_running) &&
             reserved < budget;
             ++k) {
            Req& q = *waiting_[k];
            if (q.tokens.empty()) q.tokens = replay::synthesize_prompt(*q.trace);
            reserved += static_cast<int64_t>(q.tokens.size());
            batch.push_back(c_request(q));
        }
        if (batch.empty()) return;
        std::vector<kvb_admission_t> results(batch.size());
        size_t admitted = 0;
        check(timed(out_.t, kAdmitAlloc,
                    [&] {
                        return kvb_manager_add_sequence_batch(m_, batch.data(), batch.size(), true,
                                                              results.data(), &admitted);
                    }),
              "kvb_manager_add_sequence_batch");
        if (admitted < batch.size()) out_.c.admission_failures += 1;
        for (size_t i = 0; i < admitted; ++i) {
            Req* q = waiting_.front();
            waiting_.pop_front();
            running_.push_back(q);
            q->admission_order = next_admission_order_++;
            record_admission(out_.c, *q, results[i], o_.tokens_per_block);
            q->in_prefill = true;
            q->context_pos = results[i].prepopulated_prompt_len;
            if (budget > 0) budget -= plan_chunk(*q, budget, chunks);
        }
        if (running_.empty()) {
            const Req& head = *waiting_.front();
            throw std::runtime_error(
                "request " + std::to_string(head.r) + " (" + std::to_string(head.tokens.size()) +
                " tokens) does not fit in " + std::to_string(o_.primary_blocks) +
                " primary blocks even with nothing running: raise --primary-blocks");
        }
    }

    const Options& o_;
    kvb_manager_t* m_;
    std::vector<Req>& reqs_;
    replay::Progress& progress_;
    std::deque<Req*> waiting_;
    std::vector<Req*> running_;    // admission order
    std::vector<Req*> suspended_;  // max-utilization: admission order
    uint64_t next_admission_order_ = 0;
    RunResult out_;
};

}  // namespace replay

#endif  // KVBLOCK_REPLAY_ENGINE_LOOP_HPP
