//! Batch admission: validation, planning in every window (phase 1), the scheduler's estimate,
//! and execution (phase 2).

use super::{absorb, Admission, KvCacheManager, Request, RequestStats, Sequence};
use crate::error::{KvError, KvResult};
use crate::pool::Level;
use crate::window::{AdmissionPlan, AdmitItem};

/// The scheduler's estimate of one request of a candidate batch (counting the requests before
/// it), equal to what `add_sequence_batch` then delivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchEstimate {
    /// Prompt tokens that will be reused (the prepopulated length).
    pub reusable_tokens: usize,
    /// Blocks admission will allocate (the request's `alloc_total` delta), over windows.
    pub allocated_blocks: usize,
    /// Free primary blocks admission will consume (allocations and claimed free cached blocks),
    /// over windows.
    pub free_blocks_consumed: usize,
    pub reused_blocks: usize,
    pub missed_blocks: usize,
    /// Whether this request (and every one before it) fits in the free blocks.
    pub fits: bool,
}

/// A request's plan in every window.
#[derive(Clone, Debug)]
struct RequestPlan {
    matched_tokens: usize,
    windows: Vec<AdmissionPlan>,
}

impl KvCacheManager {
    fn validate_request(&self, req: &Request) -> KvResult<()> {
        if self.sequences.contains_key(&req.id) {
            return Err(KvError::DuplicateRequest(req.id));
        }
        if req.input_length == 0 {
            return Err(KvError::InvalidArgument(
                "input_length must be positive".into(),
            ));
        }
        if req.token_ids.len() < req.input_length {
            return Err(KvError::TooFewTokens {
                input_length: req.input_length,
                num_tokens: req.token_ids.len(),
            });
        }
        if req.beam_width == 0 {
            return Err(KvError::InvalidArgument(
                "beam_width must be positive".into(),
            ));
        }
        if req.beam_width > self.cfg.max_beam_width {
            return Err(KvError::BeamWidthExceeded {
                beam_width: req.beam_width,
                max: self.cfg.max_beam_width,
            });
        }
        if req.input_length > self.cfg.max_sequence_length {
            return Err(KvError::SequenceTooLong {
                length: req.input_length,
                max: self.cfg.max_sequence_length,
            });
        }
        if let Some(extra) = &req.extra_ids {
            if extra.len() < req.input_length {
                return Err(KvError::InvalidArgument(format!(
                    "{} token extra ids for input length {}",
                    extra.len(),
                    req.input_length
                )));
            }
        }
        for item in &req.mm_items {
            if item.position < 0
                || item.length <= 0
                || item.position.checked_add(item.length).is_none()
            {
                return Err(KvError::InvalidArgument(format!(
                    "multimodal item at position {} with length {} is invalid",
                    item.position, item.length
                )));
            }
        }
        Ok(())
    }

    /// Plans a batch in order (phase 1, read-only): each request is planned in every window
    /// against the claims of the requests before it. Reuse is capped so that every window
    /// reuses the same number of tokens (the minimum over windows): the engine recomputes from
    /// there, and no window holds reused blocks that the engine would write again.
    fn plan_batch(&mut self, reqs: &[Request]) -> KvResult<Vec<RequestPlan>> {
        let mut ids = std::collections::HashSet::with_capacity(reqs.len());
        for req in reqs {
            self.validate_request(req)?;
            if !ids.insert(req.id) {
                return Err(KvError::DuplicateRequest(req.id));
            }
        }
        for w in &mut self.windows {
            w.begin_batch();
        }
        let mut plans = Vec::with_capacity(reqs.len());
        for req in reqs {
            let src = req.key_source();
            let mut cap = usize::MAX;
            let per_window = loop {
                let p: Vec<AdmissionPlan> = self
                    .windows
                    .iter_mut()
                    .map(|w| w.plan_admission(&src, req.input_length, req.beam_width, cap))
                    .collect();
                let min = p.iter().map(|x| x.matched_tokens).min().unwrap_or(0);
                if p.iter().all(|x| x.matched_tokens == min) {
                    break p;
                }
                cap = min;
            };
            // The last request's claims constrain nobody.
            if plans.len() + 1 < reqs.len() {
                for (w, plan) in self.windows.iter_mut().zip(&per_window) {
                    w.record_claims(plan);
                }
            }
            plans.push(RequestPlan {
                matched_tokens: per_window[0].matched_tokens,
                windows: per_window,
            });
        }
        Ok(plans)
    }

    /// How many requests of a planned batch fit: all of them, or none, or (with
    /// `longest_prefix`) the longest prefix whose blocks are free in every window.
    fn fitting_prefix(&self, plans: &[RequestPlan], longest_prefix: bool) -> KvResult<usize> {
        let mut needed = vec![0usize; self.windows.len()];
        for (i, plan) in plans.iter().enumerate() {
            for (wi, w) in self.windows.iter().enumerate() {
                needed[wi] += plan.windows[wi].primary_blocks_needed;
                let available = w.num_free(Level::Primary);
                if needed[wi] > available {
                    if longest_prefix {
                        return Ok(i);
                    }
                    let total: usize = plans
                        .iter()
                        .map(|p| p.windows[wi].primary_blocks_needed)
                        .sum();
                    return Err(KvError::OutOfBlocks {
                        window_size: w.window_size(),
                        needed: total,
                        available,
                    });
                }
            }
        }
        Ok(plans.len())
    }

    /// What admitting `reqs` in this order would deliver, request by request, without changing
    /// anything: the scheduler's estimate. `add_sequence_batch` on the same state delivers
    /// exactly this (same reused tokens, allocations and free blocks consumed).
    pub fn estimate_batch(&mut self, reqs: &[Request]) -> KvResult<Vec<BatchEstimate>> {
        let plans = self.plan_batch(reqs)?;
        let fitting = self.fitting_prefix(&plans, true)?;
        Ok(plans
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut e = BatchEstimate {
                    reusable_tokens: p.matched_tokens,
                    fits: i < fitting,
                    ..BatchEstimate::default()
                };
                for wp in &p.windows {
                    e.allocated_blocks += wp.allocations;
                    e.free_blocks_consumed += wp.free_blocks_consumed();
                    e.reused_blocks += wp.steps.len();
                    e.missed_blocks += wp.num_context_blocks - wp.steps.len();
                }
                e
            })
            .collect())
    }

    /// Admits a batch of requests (TensorRT-LLM `addSequenceBatch`) with a two-phase pre-claim:
    /// every reusable block of every request is claimed before anything is onboarded or
    /// allocated, so one request's allocations cannot evict what another was counted on
    /// reusing. All or nothing: when the batch does not fit, fails with `OutOfBlocks` and
    /// changes nothing; with `longest_prefix`, admits the longest prefix that fits instead and
    /// returns only its admissions.
    pub fn add_sequence_batch(
        &mut self,
        reqs: &[Request],
        longest_prefix: bool,
    ) -> KvResult<Vec<Admission>> {
        self.add_sequence_batch_owned(reqs.to_vec(), longest_prefix)
    }

    /// `add_sequence_batch` taking the requests by value: their token vectors become the
    /// sequences' (no copy of the prompts).
    pub fn add_sequence_batch_owned(
        &mut self,
        mut reqs: Vec<Request>,
        longest_prefix: bool,
    ) -> KvResult<Vec<Admission>> {
        self.require_pools()?;
        let plans = self.plan_batch(&reqs)?;
        let n = self.fitting_prefix(&plans, longest_prefix)?;
        reqs.truncate(n);
        let plans = &plans[..n];
        let now = self.now_ms();
        let mut alloc_new = vec![0u64; n];
        for (wi, w) in self.windows.iter_mut().enumerate() {
            let items: Vec<AdmitItem<'_>> = reqs
                .iter()
                .zip(plans)
                .map(|(r, p)| AdmitItem {
                    id: r.id,
                    src: r.key_source(),
                    input_length: r.input_length,
                    beam_width: r.beam_width,
                    retention: &r.retention,
                    plan: &p.windows[wi],
                })
                .collect();
            for (total, new) in alloc_new.iter_mut().zip(w.admit_batch(&items, now)) {
                *total += new;
            }
            absorb(&mut self.events, w);
        }
        let admissions: Vec<Admission> = plans
            .iter()
            .zip(&alloc_new)
            .map(|(plan, &new)| {
                let mut stats = RequestStats {
                    alloc_new_blocks: new,
                    ..RequestStats::default()
                };
                for wp in &plan.windows {
                    stats.reused_blocks += wp.steps.len() as u64;
                    stats.missed_blocks += (wp.num_context_blocks - wp.steps.len()) as u64;
                    stats.alloc_total_blocks += wp.allocations as u64;
                }
                Admission {
                    prepopulated_prompt_len: plan.matched_tokens,
                    stats,
                }
            })
            .collect();
        for (mut req, admission) in reqs.into_iter().zip(&admissions) {
            let input = req.input_length;
            req.token_ids.truncate(input);
            if let Some(extra) = &mut req.extra_ids {
                extra.truncate(input);
            }
            self.sequences.insert(
                req.id,
                Sequence {
                    input_length: input,
                    beam_width: req.beam_width,
                    token_ids: req.token_ids,
                    extra_ids: req.extra_ids,
                    lora_task_id: req.lora_task_id,
                    cache_salt: req.cache_salt,
                    mm_items: req.mm_items,
                    retention: req.retention,
                    num_tokens: input,
                    admission: *admission,
                },
            );
        }
        Ok(admissions)
    }

    /// Admits one request (TensorRT-LLM `addSequence`): a batch of one. Reuses what the tree
    /// holds, onboards host blocks, copies partial matches and allocates the rest. Fails with
    /// `OutOfBlocks` (nothing changed) when any window lacks blocks.
    pub fn add_sequence(&mut self, req: &Request) -> KvResult<Admission> {
        self.add_sequence_owned(req.clone())
    }

    /// `add_sequence` taking the request by value (its tokens are not copied).
    pub fn add_sequence_owned(&mut self, req: Request) -> KvResult<Admission> {
        let mut admitted = self.add_sequence_batch_owned(vec![req], false)?;
        Ok(admitted.pop().expect("a batch of one admitted"))
    }
}
