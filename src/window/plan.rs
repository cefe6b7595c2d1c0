//! Admission phase 1: a read-only planning walk over the reuse tree per request, against the
//! claims of the requests planned before it in the same batch.

use super::{KeySource, WindowBlockManager};
#[cfg(test)]
use crate::error::{KvError, KvResult};
use crate::key::lookup_hash;
use crate::pool::Level;
use crate::premixed::PremixedMap;

/// What admission of one sequence will do in this window, decided without changing anything.
#[derive(Clone, Debug, Default)]
pub struct AdmissionPlan {
    pub steps: Vec<PlannedReuse>,
    /// Reused prompt tokens.
    pub matched_tokens: usize,
    pub num_context_blocks: usize,
    /// Context blocks shared by all beams (the rest are per beam).
    pub num_shared_blocks: usize,
    /// Whether the request takes part in reuse (the window's reuse is on and the request did
    /// not opt out): it matches the tree, and its blocks may be stored later.
    pub reuse: bool,
    /// Primary blocks admission takes from the free queue while it runs (allocations, claimed
    /// free blocks, protected copy sources).
    pub primary_blocks_needed: usize,
    /// Blocks allocated through `get_free_block` (misses, per-beam blocks, copy destinations,
    /// onboarding): the request's `alloc_total` delta.
    pub allocations: usize,
    /// Of `allocations`, those made after the reuse steps (misses and per-beam blocks): a copy
    /// source released once its copy is queued may already be one of them.
    pub fresh_allocations: usize,
    /// The copy source of the last reuse step goes back to the free queue once that copy is
    /// queued (`WindowBlockManager::releases_copy_source`, recorded once the batch is planned).
    pub releases_copy_source: bool,
    /// Free primary copy sources claimed only while the copy is queued; they return afterwards.
    pub protected_primary: usize,
    /// Free primary blocks an earlier request of the batch only protected (as a copy source)
    /// that this request keeps: they do not return to the free queue.
    pub adopted_protected: usize,
}

impl AdmissionPlan {
    /// Net free primary blocks this request consumes once the batch is admitted.
    pub fn free_blocks_consumed(&self) -> usize {
        self.primary_blocks_needed - self.protected_primary + self.adopted_protected
    }
}

/// The claims of the admission batch being planned (phase 1), and which of its requests gets a
/// free leaf that several of them match. Cleared when a batch starts (a batch of one records
/// nothing).
#[derive(Clone, Debug, Default)]
pub(super) struct BatchClaims {
    /// What the requests planned so far in this pass claimed, by block.
    uses: PremixedMap<u32, ClaimUse>,
    /// The index in the batch of the request being planned.
    request: usize,
    /// Free leaves a request matched that an earlier request of the pass takes over.
    contests: Vec<Contest>,
    /// Contested leaves, decided for the next passes.
    settled: PremixedMap<u32, Settled>,
}

/// A later request of the batch that matched a free leaf an earlier one takes over.
#[derive(Clone, Copy, Debug)]
struct Contest {
    block: u32,
    request: usize,
    /// The later request matched the whole block (it would share it).
    whole: bool,
}

/// Who gets a free leaf several requests of a batch match, TensorRT-LLM's rule: sharing beats
/// moving, so when one of them matches the whole block it stays in the tree, shared, and the
/// others copy their tokens from it; otherwise the last of them takes it over and the earlier
/// ones copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    Shared,
    TakenOverBy(usize),
}

/// What the requests of the admission batch planned so far have claimed in this block (phase
/// 1). Later requests plan against it: a claimed block is in use, a taken-over block is no longer
/// shareable, and nothing is claimed or onboarded twice. Kept in a map of the claimed blocks
/// only.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ClaimUse {
    taken_over: bool,
    onboarded: bool,
    /// Claimed from the primary free queue only to protect a copy source (so far).
    protected_only: bool,
}

/// One reused context block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannedReuse {
    /// Exact match of a full block: shared.
    Share { block: u32 },
    /// Partial match of an unreferenced leaf: it leaves the tree and becomes this sequence's.
    TakeOver { block: u32, tokens: usize },
    /// Partial match of a referenced or inner block: its first `tokens` tokens are copied.
    Copy { source: u32, tokens: usize },
}

impl PlannedReuse {
    /// The tree block this step reads: the shared or taken-over block, or the copy source.
    pub fn block(&self) -> u32 {
        match *self {
            PlannedReuse::Share { block } | PlannedReuse::TakeOver { block, .. } => block,
            PlannedReuse::Copy { source, .. } => source,
        }
    }
}

impl WindowBlockManager {
    /// The free queue a block waits in, if it is free.
    pub fn queued_level(&self, block: u32) -> Option<Level> {
        self.queues.queued_level(block)
    }

    fn is_unused(&self, block: u32) -> bool {
        self.arena.ref_count(block) == 0
    }

    /// Number of context blocks and of those shared among beams, for a request that takes part
    /// in reuse or not: with reuse each beam owns the last block (its key differs per beam once
    /// decoding starts); without, a prompt that fills its last block shares it too.
    pub fn context_blocks(
        &self,
        input_length: usize,
        beam_width: usize,
        reuse: bool,
    ) -> (usize, usize) {
        let eff = input_length.min(self.cfg.max_token_num);
        let n = eff.div_ceil(self.cfg.tokens_per_block);
        let shared = if reuse {
            if beam_width > 1 {
                n.saturating_sub(1)
            } else {
                n
            }
        } else if beam_width == 1 || eff.is_multiple_of(self.cfg.tokens_per_block) {
            n
        } else {
            n.saturating_sub(1)
        };
        (n, shared)
    }

    /// Plans the admission of a sequence without changing anything: walks the tree for the
    /// reusable prefix (at most `cap_tokens` tokens, never the last prompt token) and counts
    /// the primary blocks it will take.
    pub fn plan_admission(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        beam_width: usize,
        cap_tokens: usize,
    ) -> AdmissionPlan {
        let mut plan = AdmissionPlan::default();
        self.plan_admission_into(src, input_length, beam_width, cap_tokens, true, &mut plan);
        plan
    }

    /// `plan_admission` into an existing plan, reusing its step buffer (no allocation once the
    /// buffer has grown to the longest reused prefix). `request_reuse` false: the request opts
    /// out of reuse (it matches nothing and will store nothing).
    pub fn plan_admission_into(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        beam_width: usize,
        cap_tokens: usize,
        request_reuse: bool,
        plan: &mut AdmissionPlan,
    ) {
        let tpb = self.cfg.tokens_per_block;
        let reuse = self.cfg.enable_reuse && request_reuse;
        let (num_context, num_shared) = self.context_blocks(input_length, beam_width, reuse);
        let mut steps = std::mem::take(&mut plan.steps);
        steps.clear();
        *plan = AdmissionPlan {
            steps,
            num_context_blocks: num_context,
            num_shared_blocks: num_shared,
            reuse,
            ..AdmissionPlan::default()
        };
        let mut claimed_free_primary = 0;
        let mut new_blocks = 0;
        let unused = |w: &Self, b: u32| w.is_unused(b) && w.claim_of(b).is_none();
        if reuse {
            let reusable = input_length - 1;
            let mut scratch = std::mem::take(&mut self.mm_scratch);
            let mut parent = self.tree.root();
            for bi in 0..num_shared {
                let start = bi * tpb;
                let end = ((bi + 1) * tpb).min(reusable);
                if start >= end {
                    break;
                }
                let key = src.key(start, end, &mut scratch);
                let lookup = lookup_hash(&key);
                let Some(m) = self.tree.find_match(
                    parent,
                    &key,
                    lookup,
                    self.cfg.enable_partial_reuse,
                    self.cfg.copy_on_partial_reuse,
                    |b| unused(self, b),
                ) else {
                    break;
                };
                let room = cap_tokens.saturating_sub(plan.matched_tokens);
                if room == 0 {
                    break;
                }
                // A recurrent-state snapshot holds the state after a whole block only.
                let granular = self.cfg.reuse_granularity_blocks > 0;
                if granular && (m.partial || m.num_tokens != tpb || room < tpb) {
                    break;
                }
                let whole = !m.partial && m.num_tokens <= room;
                let tokens = m.num_tokens.min(room);
                let capped = tokens < m.num_tokens;
                let settled = self.settled(m.block);
                let taken_over = self.claim_of(m.block).is_some_and(|c| c.taken_over);
                if taken_over && settled.is_none() && (whole || !capped) {
                    self.contest(m.block, whole);
                }
                let share = match settled {
                    Some(Settled::Shared) => whole,
                    Some(Settled::TakenOverBy(_)) => false,
                    None => whole && !taken_over,
                };
                let take_over = match settled {
                    Some(Settled::TakenOverBy(r)) => r == self.claims.request && !capped,
                    Some(Settled::Shared) => false,
                    None => !capped && unused(self, m.block) && self.tree.is_leaf(m.block),
                };
                let step = if share {
                    PlannedReuse::Share { block: m.block }
                } else {
                    if capped && !self.cfg.enable_partial_reuse {
                        break;
                    }
                    if take_over {
                        PlannedReuse::TakeOver {
                            block: m.block,
                            tokens,
                        }
                    } else {
                        PlannedReuse::Copy {
                            source: m.block,
                            tokens,
                        }
                    }
                };
                let (block, tokens) = match step {
                    PlannedReuse::Share { block } => (block, m.num_tokens),
                    PlannedReuse::TakeOver { block, tokens } => (block, tokens),
                    PlannedReuse::Copy { source, tokens } => (source, tokens),
                };
                let earlier = self.claim_of(block);
                let is_copy = matches!(step, PlannedReuse::Copy { .. });
                if earlier.is_none() && self.queues.queued_level(block) == Some(Level::Primary) {
                    claimed_free_primary += 1;
                    if is_copy {
                        plan.protected_primary += 1;
                    }
                }
                if !is_copy && earlier.is_some_and(|c| c.protected_only) {
                    plan.adopted_protected += 1;
                }
                let onboard_needed = !is_copy
                    && self.cfg.onboard_blocks
                    && !self.arena.is_primary(block)
                    && !earlier.is_some_and(|c| c.onboarded);
                if onboard_needed || is_copy {
                    new_blocks += 1;
                }
                plan.matched_tokens += tokens;
                plan.steps.push(step);
                if !matches!(step, PlannedReuse::Share { .. }) {
                    break;
                }
                parent = block;
            }
            self.mm_scratch = scratch;
        }
        let g = self.cfg.reuse_granularity_blocks;
        if g > 1 && !plan.steps.len().is_multiple_of(g) {
            // Snapshots are kept every g blocks: reuse up to the last one (a plan of fewer
            // steps, whose counts the walk recomputes).
            let cap = plan.steps.len() / g * g * tpb;
            return self.plan_admission_into(src, input_length, beam_width, cap, true, plan);
        }
        plan.fresh_allocations =
            (num_shared - plan.steps.len()) + (num_context - num_shared) * beam_width;
        new_blocks += plan.fresh_allocations;
        plan.allocations = new_blocks;
        plan.primary_blocks_needed = new_blocks + claimed_free_primary;
    }

    /// Starts planning a new batch: forgets the previous batch's claims and decisions.
    pub fn begin_batch(&mut self) {
        self.claims.uses.clear();
        self.claims.contests.clear();
        self.claims.settled.clear();
    }

    /// Starts another planning pass over the same batch (after `settle_contests`): forgets the
    /// claims, keeps the decisions.
    pub fn begin_pass(&mut self) {
        self.claims.uses.clear();
        self.claims.contests.clear();
    }

    /// Sets the index in the batch of the request planned next.
    pub fn plan_request(&mut self, index: usize) {
        self.claims.request = index;
    }

    /// Decides the free leaves contested in the last pass (see `Settled`). Returns whether
    /// anything was decided: the batch must then be planned again.
    pub fn settle_contests(&mut self) -> bool {
        if self.claims.contests.is_empty() {
            return false;
        }
        let contests = std::mem::take(&mut self.claims.contests);
        for c in &contests {
            // The requests after the one that took it over (which matched it partially).
            let rivals = contests.iter().filter(|o| o.block == c.block);
            let decision = if rivals.clone().any(|o| o.whole) {
                Settled::Shared
            } else {
                Settled::TakenOverBy(rivals.map(|o| o.request).max().unwrap_or(c.request))
            };
            self.claims.settled.entry(c.block).or_insert(decision);
        }
        true
    }

    fn settled(&self, block: u32) -> Option<Settled> {
        if self.claims.settled.is_empty() {
            return None;
        }
        self.claims.settled.get(&block).copied()
    }

    /// Records that the request being planned matched a free leaf an earlier one takes over.
    /// Only primary blocks are contested: a copy from a host block reads its host row, which a
    /// later request's onboarding of the same block would give up within the batch.
    fn contest(&mut self, block: u32, whole: bool) {
        if self.arena.level(block) != Level::Primary {
            return;
        }
        self.claims.contests.push(Contest {
            block,
            request: self.claims.request,
            whole,
        });
    }

    fn claim_of(&self, block: u32) -> Option<ClaimUse> {
        if self.claims.uses.is_empty() {
            return None;
        }
        self.claims.uses.get(&block).copied()
    }

    /// Records a planned request's claims so that later requests of the batch plan around them.
    pub fn record_claims(&mut self, plan: &AdmissionPlan) {
        for step in &plan.steps {
            let (block, taken_over, onboarded, is_copy) = match *step {
                PlannedReuse::Share { block } => (block, false, self.cfg.onboard_blocks, false),
                PlannedReuse::TakeOver { block, .. } => {
                    (block, true, self.cfg.onboard_blocks, false)
                }
                PlannedReuse::Copy { source, .. } => (source, false, false, true),
            };
            let free_primary = self.queues.queued_level(block) == Some(Level::Primary);
            match self.claims.uses.entry(block) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(ClaimUse {
                        taken_over,
                        onboarded,
                        protected_only: is_copy && free_primary,
                    });
                }
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    let c = o.get_mut();
                    c.taken_over |= taken_over;
                    c.onboarded |= onboarded;
                    if !is_copy {
                        c.protected_only = false;
                    }
                }
            }
        }
    }

    /// Whether request `i` of a planned batch (`plans`, this window's plans in batch order)
    /// gives its copy source back to the free queue as soon as its copy is queued: a source
    /// free in the primary pool before the batch that no later request copies from and no
    /// request shares or takes over. The copies of a batch execute in submission order (a
    /// backend puts a later write of a row an earlier copy reads into a later launch), so the
    /// block may be written again once its last read is queued. The manager records the answer
    /// in `releases_copy_source`; the fit check counts the release and admission makes it.
    /// Allocates nothing (a batch that does not fit allocates nothing); quadratic only in the
    /// requests that copy.
    pub fn releases_copy_source<'p>(
        &self,
        plans: impl Iterator<Item = &'p AdmissionPlan> + Clone,
        i: usize,
    ) -> bool {
        let source = match plans.clone().nth(i).and_then(|p| p.steps.last()) {
            Some(&PlannedReuse::Copy { source, .. })
                if self.queues.queued_level(source) == Some(Level::Primary) =>
            {
                source
            }
            _ => return false,
        };
        !plans.enumerate().any(|(j, plan)| {
            plan.steps.iter().any(|step| match *step {
                PlannedReuse::Copy { source: s, .. } => s == source && j > i,
                PlannedReuse::Share { block } | PlannedReuse::TakeOver { block, .. } => {
                    block == source
                }
            })
        })
    }

    /// Fails with `OutOfBlocks` when one plan needs more primary blocks than are free.
    #[cfg(test)]
    pub(super) fn check_plan(&self, plan: &AdmissionPlan) -> KvResult<()> {
        let available = self.queues.num_free(Level::Primary);
        if plan.primary_blocks_needed > available {
            return Err(KvError::OutOfBlocks {
                window_size: self.cfg.window_size,
                needed: plan.primary_blocks_needed,
                available,
            });
        }
        Ok(())
    }
}
