//! Admissions, single and batched, checked against the estimates and the model.

use super::*;

impl Harness {
    pub(super) fn op_add_sequence(&mut self) {
        // Mostly single admissions; sometimes a batch of 2 or 3 (all or nothing, or the longest
        // prefix that fits).
        let n = if self.rng.percent(25) {
            self.rng
                .range(2, 3)
                .min(MAX_LIVE.saturating_sub(self.seqs.len()).max(1))
        } else {
            1
        };
        let reqs: Vec<Request> = (0..n).map(|_| self.random_request()).collect();
        let longest_prefix = n > 1 && self.rng.percent(50);
        // With one window, every consecutive full prompt block in the tree is reused.
        let reusable_blocks = if self.windows.len() == 1 {
            let w = self.windows[0];
            self.m
                .count_reusable_blocks(&reqs[0], w, false)
                .unwrap_or_else(|e| self.fail(format!("count_reusable_blocks: {e}")))
        } else {
            0
        };
        let before = self.snapshot();
        // The scheduler's estimate changes nothing and is exactly what admission delivers.
        let estimates = self
            .m
            .estimate_batch(&reqs)
            .unwrap_or_else(|e| self.fail(format!("estimate_batch: {e}")));
        self.expect_unchanged(&before, "estimate_batch");
        let result = if n == 1 {
            self.m.add_sequence(&reqs[0]).map(|a| vec![a])
        } else {
            self.m.add_sequence_batch(&reqs, longest_prefix)
        };
        self.log(|| {
            let described: Vec<String> = reqs
                .iter()
                .map(|r| {
                    format!(
                        "{} tokens {:?} input {} beam {} lora {:?} salt {:?} retention {:?}",
                        r.id,
                        r.token_ids,
                        r.input_length,
                        r.beam_width,
                        r.lora_task_id,
                        r.cache_salt,
                        r.retention
                    )
                })
                .collect();
            format!("add_sequence(longest_prefix {longest_prefix}) {described:?} -> {result:?}")
        });
        let admissions = match result {
            Ok(a) => a,
            Err(KvError::OutOfBlocks { .. }) => {
                self.cov.oob_admissions += 1;
                self.expect_unchanged(&before, "add_sequence");
                if reqs.iter().any(|r| self.m.has_sequence(r.id)) {
                    self.fail("a failed admission left a sequence behind");
                }
                if estimates.iter().all(|e| e.fits) {
                    self.fail(format!(
                        "estimated to fit, admission ran out: {estimates:?}"
                    ));
                }
                return;
            }
            Err(e) => self.fail(format!("add_sequence of {} requests: {e}", reqs.len())),
        };
        let fitting = estimates.iter().take_while(|e| e.fits).count();
        if admissions.len() != fitting && (longest_prefix || admissions.len() != n) {
            self.fail(format!(
                "admitted {} of {n}, estimated to fit {fitting}: {estimates:?}",
                admissions.len()
            ));
        }
        if admissions.len() < n {
            self.cov.oob_admissions += 1;
        }
        let after = self.snapshot();
        let consumed: usize = before.1.iter().zip(&after.1).map(|(b, a)| b.0 - a.0).sum();
        let estimated: usize = estimates[..admissions.len()]
            .iter()
            .map(|e| e.free_blocks_consumed)
            .sum();
        if consumed != estimated {
            self.fail(format!(
                "admission consumed {consumed} free primary blocks, estimated {estimated}"
            ));
        }
        for r in &reqs[admissions.len()..] {
            if self.m.has_sequence(r.id) {
                self.fail(format!(
                    "request {} was not admitted but has a sequence",
                    r.id
                ));
            }
        }
        if let Some(first) = admissions.first() {
            if !reqs[0].disable_reuse && first.prepopulated_prompt_len < reusable_blocks * TPB {
                self.fail(format!(
                    "count_reusable_blocks found {reusable_blocks} blocks, admission reused {} \
                     tokens",
                    first.prepopulated_prompt_len
                ));
            }
        }
        let mut admitted = Vec::new();
        for ((req, adm), est) in reqs.iter().zip(&admissions).zip(&estimates) {
            let id = req.id;
            let input = req.input_length;
            let prepop = adm.prepopulated_prompt_len;
            let got = (
                prepop,
                adm.stats.alloc_total_blocks as usize,
                adm.stats.reused_blocks as usize,
                adm.stats.missed_blocks as usize,
            );
            let want = (
                est.reusable_tokens,
                est.allocated_blocks,
                est.reused_blocks,
                est.missed_blocks,
            );
            if got != want {
                self.fail(format!(
                    "request {id}: admission (prepopulated, allocated, reused, missed) {got:?} \
                     != estimate {want:?}"
                ));
            }
            let seq = Seq::new(
                &req.token_ids[..input],
                req.lora_task_id,
                req.cache_salt,
                req.beam_width,
                !req.disable_reuse,
            );
            if prepop >= input {
                self.fail(format!("prepopulated {prepop} >= input length {input}"));
            }
            if req.disable_reuse && (prepop > 0 || adm.stats.reused_blocks > 0) {
                self.fail(format!(
                    "request {id} opted out of reuse and reused {prepop} tokens"
                ));
            }
            if prepop > 0 && !self.stored.contains(&seq.hashes[prepop - 1]) {
                self.fail(format!(
                    "request {id} reused {prepop} tokens {:?} (lora {:?}, salt {:?}) that no \
                     store recorded",
                    &req.token_ids[..prepop],
                    req.lora_task_id,
                    req.cache_salt
                ));
            }
            let context_blocks = self.windows.len() * input.div_ceil(TPB);
            let counted = (adm.stats.reused_blocks + adm.stats.missed_blocks) as usize;
            if counted != context_blocks {
                self.fail(format!(
                    "reused {} + missed {} != {context_blocks} context blocks",
                    adm.stats.reused_blocks, adm.stats.missed_blocks
                ));
            }
            self.cov.admitted += 1;
            self.cov.batch_admitted += usize::from(n > 1);
            self.cov.beam_admitted += usize::from(req.beam_width > 1);
            self.cov.opted_out_admitted += usize::from(req.disable_reuse);
            self.cov.reuse_hits += usize::from(prepop > 0);
            self.cov.partial_hits += usize::from(prepop % TPB != 0);
            self.cov.verified_reused_positions += prepop;
            self.seqs.insert(id, seq);
            admitted.push((id, prepop, input));
        }
        // The whole batch's copies are done: check every reused position before the engine
        // computes (writes) any of the new ones.
        for &(id, prepop, _) in &admitted {
            self.data(id, 0..prepop, false, "reused prompt data");
        }
        for &(id, prepop, input) in &admitted {
            self.data(id, prepop..input, true, "");
        }
    }
}
