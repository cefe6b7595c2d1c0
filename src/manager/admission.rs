//! Batch admission: validation, planning in every window (phase 1), the scheduler's estimate,
//! and execution (phase 2).

use super::lifecycle::CountedBlocks;
use super::{absorb, Admission, KvCacheManager, Request, RequestRef, RequestStats, Sequence};
use crate::error::{KvError, KvResult};
use crate::pool::Level;
use crate::tree::SlotKeyAttrs;
use crate::window::{AdmissionPlan, AdmitItem, PlannedReuse};

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

/// Planning passes over one batch at most (see `plan_batch`).
const MAX_PLANNING_PASSES: usize = 8;

/// A request's plan in every window.
#[derive(Clone, Debug, Default)]
pub(super) struct RequestPlan {
    matched_tokens: usize,
    windows: Vec<AdmissionPlan>,
}

impl KvCacheManager {
    fn validate_request(&self, req: &RequestRef<'_>) -> KvResult<()> {
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
        if let Some(extra) = req.extra_ids {
            if extra.len() < req.input_length {
                return Err(KvError::InvalidArgument(format!(
                    "{} token extra ids for input length {}",
                    extra.len(),
                    req.input_length
                )));
            }
        }
        for item in req.mm_items {
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

    /// Plans a batch in order (phase 1, read-only) into `self.plans` (its buffers are reused:
    /// planning allocates nothing once they have grown): each request is planned in every
    /// window against the claims of the requests before it. Reuse is capped so that every
    /// window reuses the same number of tokens (the minimum over windows): the engine recomputes
    /// from there, and no window holds reused blocks that the engine would write again.
    fn plan_batch(&mut self, reqs: &[RequestRef<'_>]) -> KvResult<()> {
        for (i, req) in reqs.iter().enumerate() {
            self.validate_request(req)?;
            // Quadratic only in the batch size, and without allocating.
            if reqs[..i].iter().any(|r| r.id == req.id) {
                return Err(KvError::DuplicateRequest(req.id));
            }
        }
        for w in &mut self.windows {
            w.begin_batch();
        }
        let mut plans = std::mem::take(&mut self.plans);
        if plans.len() < reqs.len() {
            plans.resize_with(reqs.len(), RequestPlan::default);
        }
        // Free leaves several requests match are decided between passes (`settle_contests`);
        // each pass decides at least one more, and a plan is valid whatever is decided, so the
        // passes are bounded.
        for _pass in 0..MAX_PLANNING_PASSES {
            self.plan_pass(reqs, &mut plans);
            let mut decided = false;
            for w in &mut self.windows {
                decided |= w.settle_contests();
            }
            if !decided {
                break;
            }
            for w in &mut self.windows {
                w.begin_pass();
            }
        }
        let n = reqs.len();
        for (wi, w) in self.windows.iter().enumerate() {
            for i in 0..n {
                // Only a request whose last reuse step copies can give its source back.
                let copies = matches!(
                    plans[i].windows[wi].steps.last(),
                    Some(PlannedReuse::Copy { .. })
                );
                let released =
                    copies && w.releases_copy_source(plans[..n].iter().map(|p| &p.windows[wi]), i);
                plans[i].windows[wi].releases_copy_source = released;
            }
        }
        self.plans = plans;
        Ok(())
    }

    /// One planning pass over the batch, in order.
    fn plan_pass(&mut self, reqs: &[RequestRef<'_>], plans: &mut [RequestPlan]) {
        let nw = self.windows.len();
        for (ri, req) in reqs.iter().enumerate() {
            let src = req.key_source();
            let plan = &mut plans[ri];
            plan.windows.resize_with(nw, AdmissionPlan::default);
            let mut cap = usize::MAX;
            loop {
                for (w, p) in self.windows.iter_mut().zip(plan.windows.iter_mut()) {
                    w.plan_request(ri);
                    w.plan_admission_into(
                        &src,
                        req.input_length,
                        req.beam_width,
                        cap,
                        !req.disable_reuse,
                        p,
                    );
                }
                let min = plan
                    .windows
                    .iter()
                    .map(|x| x.matched_tokens)
                    .min()
                    .unwrap_or(0);
                if plan.windows.iter().all(|x| x.matched_tokens == min) {
                    break;
                }
                cap = min;
            }
            // The last request's claims constrain nobody.
            if ri + 1 < reqs.len() {
                for (w, p) in self.windows.iter_mut().zip(&plan.windows) {
                    w.record_claims(p);
                }
            }
            plan.matched_tokens = plan.windows[0].matched_tokens;
        }
    }

    /// How many of the first `n` planned requests fit: all of them, or none, or (with
    /// `longest_prefix`) the longest prefix whose blocks are free in every window.
    fn fitting_prefix(&self, n: usize, longest_prefix: bool) -> KvResult<usize> {
        let plans = &self.plans[..n];
        // The first request that does not fit, over windows (the lowest window on a tie).
        let mut first_short: Option<(usize, usize)> = None;
        for (wi, w) in self.windows.iter().enumerate() {
            let mut available = w.num_free(Level::Primary);
            // Suspended blocks that could move to the host tier count too, computed only once
            // the free blocks fall short.
            let mut movable_counted = false;
            // Phase 1 claims every request's reused free blocks up front (`claims`); phase 2
            // allocates request by request, each copy source going back to the free queue once
            // its last copy is queued (`released`): the most blocks out of the free queue at
            // once is `claims + peak`.
            let (mut claims, mut allocated, mut peak) = (0, 0, 0);
            for (i, plan) in plans.iter().enumerate() {
                let p = &plan.windows[wi];
                let released = usize::from(p.releases_copy_source);
                let reuse_steps = p.allocations - p.fresh_allocations;
                claims += p.primary_blocks_needed - p.allocations;
                peak = peak
                    .max(allocated + reuse_steps + p.fresh_allocations.saturating_sub(released));
                allocated = allocated + p.allocations - released;
                let needed = claims + peak;
                if needed > available && !movable_counted {
                    available += movable_for(w, wi, plans);
                    movable_counted = true;
                }
                if needed > available {
                    if first_short.is_none_or(|(j, _)| i < j) {
                        first_short = Some((i, wi));
                    }
                    break;
                }
            }
        }
        let Some((i, wi)) = first_short else {
            return Ok(n);
        };
        if longest_prefix {
            return Ok(i);
        }
        let total: usize = plans
            .iter()
            .map(|p| p.windows[wi].primary_blocks_needed)
            .sum();
        let w = &self.windows[wi];
        Err(KvError::OutOfBlocks {
            window_size: w.window_size(),
            needed: total,
            available: w.num_free(Level::Primary) + movable_for(w, wi, plans),
        })
    }

    /// What admitting `reqs` in this order would deliver, request by request, without changing
    /// anything: the scheduler's estimate. `add_sequence_batch` on the same state delivers
    /// exactly this (same reused tokens, allocations and free blocks consumed).
    pub fn estimate_batch(&mut self, reqs: &[Request]) -> KvResult<Vec<BatchEstimate>> {
        let refs: Vec<RequestRef<'_>> = reqs.iter().map(Request::as_ref).collect();
        self.estimate_batch_refs(&refs)
    }

    /// `estimate_batch` over borrowed requests.
    pub fn estimate_batch_refs(&mut self, reqs: &[RequestRef<'_>]) -> KvResult<Vec<BatchEstimate>> {
        self.plan_batch(reqs)?;
        let fitting = self.fitting_prefix(reqs.len(), true)?;
        Ok(self.plans[..reqs.len()]
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
        let refs: Vec<RequestRef<'_>> = reqs.iter().map(Request::as_ref).collect();
        self.add_sequence_batch_refs(&refs, longest_prefix)
    }

    /// `add_sequence_batch` taking the requests by value.
    pub fn add_sequence_batch_owned(
        &mut self,
        reqs: Vec<Request>,
        longest_prefix: bool,
    ) -> KvResult<Vec<Admission>> {
        self.add_sequence_batch(&reqs, longest_prefix)
    }

    /// `add_sequence_batch` over borrowed requests: the tokens of each admitted request are
    /// copied once, into its blocks' key slots (the sequence keeps no copy of its own); nothing
    /// is copied or allocated for a batch that does not fit (once the planning buffers have
    /// grown).
    pub fn add_sequence_batch_refs(
        &mut self,
        reqs: &[RequestRef<'_>],
        longest_prefix: bool,
    ) -> KvResult<Vec<Admission>> {
        let n = self.plan_fitting(reqs, longest_prefix)?;
        let reqs = &reqs[..n];
        self.note_retentions(reqs);
        let now = self.op_now_ms();
        let plans = std::mem::take(&mut self.plans);
        let mut alloc_new = vec![0u64; n];
        let mut counted = vec![CountedBlocks::default(); n];
        for (wi, w) in self.windows.iter_mut().enumerate() {
            let items: Vec<AdmitItem<'_>> = reqs
                .iter()
                .zip(&plans)
                .map(|(r, p)| AdmitItem {
                    id: r.id,
                    src: r.key_source(),
                    input_length: r.input_length,
                    beam_width: r.beam_width,
                    retention: r.retention,
                    plan: &p.windows[wi],
                })
                .collect();
            let news = w.admit_batch(&items, now);
            let per_request = alloc_new.iter_mut().zip(news).zip(&mut counted);
            for (((sum, new), c), (req, plan)) in per_request.zip(reqs.iter().zip(&plans)) {
                *sum += new;
                // What reverting the admission gives back: the blocks past the reused prefix.
                let tail = w.blocks_for_tokens(req.input_length)
                    - w.blocks_for_tokens(plan.matched_tokens);
                let total = (tail as u64).min(plan.windows[wi].allocations as u64);
                c.add(wi, total, new.min(total));
            }
            absorb(&mut self.events, w);
        }
        let admissions = reqs
            .iter()
            .zip(&plans)
            .zip(alloc_new)
            .zip(counted)
            .map(|(((req, plan), new), counted)| self.record_sequence(req, plan, new, counted))
            .collect();
        self.plans = plans;
        Ok(admissions)
    }

    /// Validates and plans `reqs` and returns how many of them fit (see `add_sequence_batch`).
    fn plan_fitting(&mut self, reqs: &[RequestRef<'_>], longest_prefix: bool) -> KvResult<usize> {
        self.require_pools()?;
        self.plan_batch(reqs)?;
        self.fitting_prefix(reqs.len(), longest_prefix)
    }

    /// Records the sequence of an admitted request and returns its admission figures. Its
    /// tokens are not copied here: admission wrote them into its blocks' key slots.
    fn record_sequence(
        &mut self,
        req: &RequestRef<'_>,
        plan: &RequestPlan,
        alloc_new: u64,
        counted: CountedBlocks,
    ) -> Admission {
        let mut stats = RequestStats {
            alloc_new_blocks: alloc_new,
            ..RequestStats::default()
        };
        for wp in &plan.windows {
            stats.reused_blocks += wp.steps.len() as u64;
            stats.missed_blocks += (wp.num_context_blocks - wp.steps.len()) as u64;
            stats.alloc_total_blocks += wp.allocations as u64;
        }
        let admission = Admission {
            prepopulated_prompt_len: plan.matched_tokens,
            stats,
        };
        self.sequences.insert(
            req.id,
            Sequence {
                input_length: req.input_length,
                beam_width: req.beam_width,
                key_attrs: SlotKeyAttrs {
                    uses_extra_ids: req.extra_ids.is_some(),
                    lora_task_id: req.lora_task_id,
                    cache_salt: req.cache_salt,
                },
                mm_items: req.mm_items.to_vec(),
                retention: req.retention.clone(),
                num_tokens: req.input_length,
                admission,
                life: super::lifecycle::SeqLifecycle::admitted(
                    req.input_length,
                    plan.matched_tokens,
                    counted,
                ),
            },
        );
        admission
    }

    /// Admits one request (TensorRT-LLM `addSequence`): a batch of one. Reuses what the tree
    /// holds, onboards host blocks, copies partial matches and allocates the rest. Fails with
    /// `OutOfBlocks` (nothing changed) when any window lacks blocks.
    pub fn add_sequence(&mut self, req: &Request) -> KvResult<Admission> {
        self.add_sequence_ref(&req.as_ref())
    }

    /// `add_sequence` taking the request by value.
    pub fn add_sequence_owned(&mut self, req: Request) -> KvResult<Admission> {
        self.add_sequence(&req)
    }

    /// `add_sequence` over a borrowed request: its tokens are copied once, into its blocks' key
    /// slots, and only when it is admitted. A request that does not fit costs one planning walk over
    /// its reusable prefix and allocates nothing.
    pub fn add_sequence_ref(&mut self, req: &RequestRef<'_>) -> KvResult<Admission> {
        let mut admitted = self.add_sequence_batch_refs(std::slice::from_ref(req), false)?;
        Ok(admitted.pop().expect("a batch of one admitted"))
    }
}

/// Primary blocks of window `wi` that moving suspended sequences' blocks to the host tier can
/// free for a batch planned as `plans`: the blocks the batch reuses or copies from stay (they
/// are about to be read), and the free host blocks it onboards are not destinations.
fn movable_for(w: &crate::window::WindowBlockManager, wi: usize, plans: &[RequestPlan]) -> usize {
    if !w.has_suspended() {
        return 0;
    }
    let mut planned = std::collections::HashSet::new();
    for plan in plans {
        for step in &plan.windows[wi].steps {
            planned.insert(step.block());
        }
    }
    let host_claims = planned
        .iter()
        .filter(|&&b| w.queued_level(b) == Some(Level::Secondary))
        .count();
    w.movable_count(&|b| planned.contains(&b), host_claims)
}
