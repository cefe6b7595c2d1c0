//! The scheduler capacity lifecycle (TensorRT-LLM V2's `KVCacheManagerV2`, driven by its
//! max-utilization scheduler): per sequence a capacity, a history and a committed length;
//! resizing, generation and context allocations with their reverts, padding extension, and
//! suspend / resume.
//!
//! Lengths of a sequence, in tokens: `committed ≤ history ≤ capacity`, and `num_tokens` known
//! token ids. `capacity` tokens have KV slots (blocks); `history` tokens have KV computed;
//! `committed` tokens are reusable through this sequence (reused at admission or stored since).
//! V1 calls keep these up to date (admission: capacity = prompt, history = committed = reused;
//! `add_token`: capacity ≥ tokens, history = tokens − 1; storing advances `committed`).
//!
//! Every operation is atomic: a grow that cannot be served returns `false` and changes nothing;
//! a refused shrink or a misuse is an error and changes nothing.

use super::{absorb, KvCacheManager};
use crate::error::{KvError, KvResult};
use crate::window::SlotTokens;

/// Blocks an allocation counted in each window's statistics (`alloc_total`, `alloc_new`), so
/// that reverting it uncounts them: only committed allocations stay in the statistics, as in
/// TensorRT-LLM V2. The first window's pair is inline, so that recording one costs no heap
/// allocation with one window (admission records one for every request).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct CountedBlocks {
    first: (u64, u64),
    rest: Vec<(u64, u64)>,
}

impl CountedBlocks {
    /// Adds `(total, new)` blocks counted in window `i`.
    pub(super) fn add(&mut self, i: usize, total: u64, new: u64) {
        let slot = if i == 0 {
            &mut self.first
        } else {
            if self.rest.len() < i {
                self.rest.resize(i, (0, 0));
            }
            &mut self.rest[i - 1]
        };
        slot.0 += total;
        slot.1 += new;
    }

    /// Adds every window's count of `other`.
    fn merge(&mut self, other: &CountedBlocks) {
        for (i, (total, new)) in other.iter() {
            self.add(i, total, new);
        }
    }

    /// `(window index, (total, new))` for every window with a count.
    fn iter(&self) -> impl Iterator<Item = (usize, (u64, u64))> + '_ {
        std::iter::once(self.first)
            .chain(self.rest.iter().copied())
            .enumerate()
    }
}

/// A generation allocation, recorded so that its revert undoes exactly what it added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct GenerationAllocation {
    /// Capacity before the allocation.
    pre_capacity: usize,
    /// Draft tokens it reserved (padding extensions included).
    num_draft_tokens: usize,
    /// Blocks it (and its padding extensions) counted, per window.
    counted: CountedBlocks,
}

/// A context allocation that grew the capacity (admission's included), recorded for
/// `revert_allocate_context`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ContextAllocation {
    /// Capacity before the allocation.
    pre_capacity: usize,
    /// Blocks it counted, per window.
    counted: CountedBlocks,
}

/// The lifecycle state of one sequence.
#[derive(Clone, Debug, Default)]
pub(super) struct SeqLifecycle {
    pub(super) capacity: usize,
    pub(super) history: usize,
    pub(super) committed: usize,
    /// Tokens the sequence cannot lose (reused at admission).
    pub(super) reused: usize,
    pub(super) suspended: bool,
    /// Its prompt's KV arrives from another engine (`disagg::receive`): only the receive
    /// calls act on it until the receive completes or aborts.
    pub(super) receiving: bool,
    /// Known tokens past the capacity (positions `capacity..num_tokens`), kept while their
    /// blocks are given back (a reverted context allocation), with their extra ids.
    pending_tokens: Vec<i32>,
    pending_extra_ids: Vec<u64>,
    generation: Option<GenerationAllocation>,
    /// This iteration's context allocation, when it grew the capacity.
    context: Option<ContextAllocation>,
    /// The current step: the iteration it belongs to and the tokens the sequence had when
    /// it began (see `step_slack`).
    step: StepMark,
}

/// Where a sequence's current step began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StepMark {
    /// The manager's iteration (`refresh_blocks` calls) when the step began; 0 before any.
    pub(super) iteration: u64,
    /// Tokens the sequence had when the step began: its first token is token number `start`.
    pub(super) start: usize,
}

impl SeqLifecycle {
    /// A sequence just admitted: its prompt allocated, `reused` tokens found in the cache. The
    /// admission is a context allocation that grew the capacity from `reused`, counting
    /// `counted` blocks per window.
    pub(super) fn admitted(input_length: usize, reused: usize, counted: CountedBlocks) -> Self {
        SeqLifecycle {
            capacity: input_length,
            history: reused,
            committed: reused,
            reused,
            context: (input_length > reused).then_some(ContextAllocation {
                pre_capacity: reused,
                counted,
            }),
            step: StepMark {
                iteration: 0,
                start: input_length,
            },
            ..SeqLifecycle::default()
        }
    }

    /// Bookkeeping of `add_token`: the sequence grew to `num_tokens`, all but the last computed;
    /// the step's generation allocation is consumed. (Prefill being over, a context record left
    /// from it is ignored by `revert_allocate_context`, which sees the generated tokens.)
    #[inline(always)]
    pub(super) fn token_added(&mut self, num_tokens: usize) {
        self.capacity = self.capacity.max(num_tokens);
        self.history = self.history.max(num_tokens - 1);
        self.generation = None;
    }

    /// The step a growth to `num_tokens` tokens (from `prev_tokens`) belongs to, and how many
    /// tokens that step added before the newest (drafts after the step's token): a sliding
    /// window holds every block the step's first token attends. A step is the tokens added in
    /// one iteration (between two `refresh_blocks`); an engine that never calls
    /// `refresh_blocks` (`iteration` 0) makes each growth a step of its own. Pure: the caller
    /// records the mark once the growth succeeded.
    pub(super) fn step_for(
        &self,
        iteration: u64,
        prev_tokens: usize,
        num_tokens: usize,
    ) -> (StepMark, usize) {
        let mark = if iteration == 0 || self.step.iteration != iteration {
            StepMark {
                iteration,
                start: prev_tokens,
            }
        } else {
            self.step
        };
        (
            mark,
            num_tokens.saturating_sub(1).saturating_sub(mark.start),
        )
    }

    /// Records the step of a successful growth (`step_for`).
    pub(super) fn set_step(&mut self, mark: StepMark) {
        self.step = mark;
    }

    /// Tokens the current step added after its first, as the last growth counted them.
    pub(super) fn step_slack(&self, num_tokens: usize) -> usize {
        num_tokens.saturating_sub(1).saturating_sub(self.step.start)
    }

    /// The least capacity a shrink may reach.
    fn floor(&self) -> usize {
        self.history.max(self.committed).max(self.reused)
    }
}

/// A sequence's lengths (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceLengths {
    pub num_tokens: usize,
    pub capacity: usize,
    pub history: usize,
    pub committed: usize,
    /// Prompt tokens reused at admission.
    pub reused: usize,
    pub suspended: bool,
}

/// What `revert_allocate_context` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextRevert {
    /// No context allocation had grown the capacity: nothing changed.
    NothingToRevert,
    /// The capacity went back to what it was before the allocation and the sequence is
    /// suspended (resume it, then allocate again, to continue).
    ShrunkAndSuspended,
    /// Prefill had already computed past the old capacity, so it could not shrink: the
    /// sequence was stored for reuse and released. Admit the request again to restart prefill.
    Released,
}

impl KvCacheManager {
    pub(super) fn active_sequence(&self, id: u64) -> KvResult<&super::Sequence> {
        let seq = self.sequence(id)?;
        if seq.life.suspended {
            return Err(KvError::SequenceSuspended(id));
        }
        Ok(seq)
    }

    /// The lifecycle record of a sequence the caller has checked exists.
    fn life_mut(&mut self, id: u64) -> &mut SeqLifecycle {
        &mut self.sequences.get_mut(&id).expect("sequence checked").life
    }

    /// The lengths of a sequence.
    pub fn sequence_lengths(&self, id: u64) -> KvResult<SequenceLengths> {
        let s = self.sequence(id)?;
        Ok(SequenceLengths {
            num_tokens: s.num_tokens,
            capacity: s.life.capacity,
            history: s.life.history,
            committed: s.life.committed,
            reused: s.life.reused,
            suspended: s.life.suspended,
        })
    }

    /// Whether a sequence is suspended.
    pub fn is_suspended(&self, id: u64) -> KvResult<bool> {
        Ok(self.sequence(id)?.life.suspended)
    }

    /// Resizes a live sequence to `capacity` tokens in every window. Growing allocates blocks
    /// (moving suspended sequences' blocks to the host tier if the GPU pool needs room) and
    /// returns `Ok(false)`, changing nothing, when that cannot be served. Shrinking gives blocks
    /// back and is refused with an error below the history, the committed length or the reused
    /// prompt. Known tokens past a shrunk capacity are kept and written back when it grows
    /// again. Forgets recorded generation and context allocations (their reverts become no-ops).
    pub fn resize(&mut self, id: u64, capacity: usize) -> KvResult<bool> {
        let done = self.resize_to(id, capacity, &mut CountedBlocks::default())?;
        if done {
            let life = self.life_mut(id);
            life.generation = None;
            life.context = None;
        }
        Ok(done)
    }

    /// Reserves one more KV slot for sequence `id` without its token id (TensorRT-LLM's
    /// `addToken(requestId)`, which reads the token from the request later): in every sliding
    /// window, first detaches the front blocks wholly before the window of the new last slot
    /// (the token the engine computes next), then grows the capacity by one (`resize`). The
    /// token id arrives later (`add_token` into the reserved slot); a block detached before its
    /// tokens arrived never gets them, and the sequence then stops storing in that window, so
    /// no key is ever cut from unknown tokens. Returns `Ok(false)`, changing nothing, when the
    /// new slot's block cannot be had even with the detached blocks freed.
    /// With beam search a block boundary takes a new block for every beam (no beam's blocks
    /// leave a sliding window, as with known tokens); the other capacity operations stay beam
    /// width 1. `SequenceTooLong` past `max_kv_tokens` and `SequenceSuspended` for a suspended
    /// sequence.
    pub fn add_slot(&mut self, id: u64) -> KvResult<bool> {
        let seq = self.active_sequence(id)?;
        let beam_search = seq.beam_width != 1;
        let (num_tokens, capacity) = (seq.num_tokens, seq.life.capacity);
        let slots = self.capacity_sum(capacity, 1)?;
        let max_kv_tokens = self.max_kv_tokens();
        if slots > max_kv_tokens {
            return Err(KvError::SequenceTooLong {
                length: slots,
                max: max_kv_tokens,
            });
        }
        let max_len = self.cfg.max_sequence_length;
        let fits = self
            .windows
            .iter()
            .all(|w| w.can_grow_sliding(id, slots, w.config().is_swa(max_len)));
        if !fits {
            return Ok(false);
        }
        let now = self.op_now_ms();
        for w in &mut self.windows {
            let swa = w.config().is_swa(max_len);
            w.slide_to_slots(id, slots, num_tokens, swa, now);
            absorb(&mut self.events, w);
        }
        let grown = if beam_search {
            // Only ever a grow: `resize` refuses beam search for its shrinks.
            let grown = self.grow(id, slots, &mut CountedBlocks::default())?;
            let life = self.life_mut(id);
            life.generation = None;
            life.context = None;
            grown
        } else {
            self.resize(id, slots)?
        };
        debug_assert!(grown, "checked with the detached blocks freed");
        Ok(grown)
    }

    /// `resize` without touching the recorded allocations; a grow adds the blocks it counts in
    /// the statistics to `counted` (per window).
    fn resize_to(
        &mut self,
        id: u64,
        capacity: usize,
        counted: &mut CountedBlocks,
    ) -> KvResult<bool> {
        let seq = self.active_sequence(id)?;
        if seq.beam_width != 1 {
            return Err(KvError::Unsupported(
                "capacity operations need beam width 1".into(),
            ));
        }
        let max_kv_tokens = self.max_kv_tokens();
        if capacity > max_kv_tokens {
            return Err(KvError::SequenceTooLong {
                length: capacity,
                max: max_kv_tokens,
            });
        }
        let current = seq.life.capacity;
        if capacity == current {
            return Ok(true);
        }
        if capacity > current {
            return self.grow(id, capacity, counted);
        }
        let floor = seq.life.floor();
        if capacity < floor {
            return Err(KvError::InvalidArgument(format!(
                "cannot shrink sequence {id} to {capacity} tokens: {} are computed, {} committed \
                 and {} reused (a shrink never drops them)",
                seq.life.history, seq.life.committed, seq.life.reused
            )));
        }
        self.shrink(id, capacity)?;
        Ok(true)
    }

    fn grow(&mut self, id: u64, capacity: usize, counted: &mut CountedBlocks) -> KvResult<bool> {
        if !self.windows.iter().all(|w| w.can_grow(id, capacity)) {
            return Ok(false);
        }
        let before: Vec<(u64, u64)> = self
            .windows
            .iter()
            .map(|w| (w.stats().alloc_total, w.stats().alloc_new))
            .collect();
        // (A grow allocates blocks anyway; this list is no extra cost worth avoiding.)
        let now = self.op_now_ms();
        let seq = &self.sequences[&id];
        let retention = seq.retention.decode_retention();
        let old = seq.life.capacity;
        let restore_end = capacity.min(seq.num_tokens);
        for w in &mut self.windows {
            w.grow(id, capacity, retention, now);
            absorb(&mut self.events, w);
        }
        for (i, (w, (total, new))) in self.windows.iter().zip(before).enumerate() {
            counted.add(i, w.stats().alloc_total - total, w.stats().alloc_new - new);
        }
        let seq = self.sequences.get_mut(&id).expect("checked");
        if restore_end > old {
            // Tokens kept while their blocks were given back go into the new blocks' slots.
            let n = restore_end - old;
            let tokens: Vec<i32> = seq.life.pending_tokens.drain(..n).collect();
            let extra: Vec<u64> = if seq.key_attrs.uses_extra_ids {
                seq.life.pending_extra_ids.drain(..n).collect()
            } else {
                Vec::new()
            };
            let extra = seq.key_attrs.uses_extra_ids.then_some(&extra[..]);
            for w in &mut self.windows {
                w.write_tokens(id, old, &tokens, extra);
            }
        }
        self.life_mut(id).capacity = capacity;
        Ok(true)
    }

    /// Shrinks to `capacity` (validated by the caller): the surplus blocks go back to their
    /// free queues. The known tokens past the new capacity are kept and written back, the same
    /// tokens in the same slots, when it grows again, so a shared new last block is kept as it
    /// is: giving capacity back never needs a free block (a scheduler reverts exactly when
    /// blocks are short).
    fn shrink(&mut self, id: u64, capacity: usize) -> KvResult<()> {
        for w in &self.windows {
            if !w.can_shrink_to(id, capacity) {
                return Err(KvError::Unsupported(format!(
                    "shrinking to {capacity} tokens would reach blocks window {} already detached",
                    w.window_size()
                )));
            }
        }
        let seq = &self.sequences[&id];
        let keep_end = seq.num_tokens.min(seq.life.capacity);
        // Known tokens whose blocks go back are kept (in order, before those already kept).
        let kept = if capacity < keep_end {
            self.windows[0].read_tokens(id, capacity, keep_end)
        } else {
            SlotTokens::default()
        };
        self.shrink_windows(id, capacity, true);
        let seq = self.sequences.get_mut(&id).expect("checked");
        if !kept.token_ids.is_empty() {
            seq.life.pending_tokens.splice(0..0, kept.token_ids);
            if seq.key_attrs.uses_extra_ids {
                seq.life.pending_extra_ids.splice(0..0, kept.extra_ids);
            }
        }
        seq.life.capacity = capacity;
        Ok(())
    }

    /// The capacity `base + more` tokens, or `SequenceTooLong` when the sum overflows.
    fn capacity_sum(&self, base: usize, more: usize) -> KvResult<usize> {
        base.checked_add(more).ok_or(KvError::SequenceTooLong {
            length: usize::MAX,
            max: self.max_kv_tokens(),
        })
    }

    /// Takes back the blocks a reverted allocation counted in the windows' statistics.
    fn uncount(&mut self, counted: &CountedBlocks) {
        for (i, (total, new)) in counted.iter() {
            if let Some(w) = self.windows.get_mut(i) {
                w.uncount_allocations(total, new);
            }
        }
    }

    /// Reserves KV slots for the next generation step: `1 + num_draft_tokens` tokens past the
    /// known ones (capped at `max_kv_tokens`: the maximum sequence length plus the configured
    /// extra KV and draft tokens; a count whose sum overflows is `SequenceTooLong`). Returns
    /// `Ok(false)`, changing nothing, when the blocks cannot be had. Records the capacity
    /// before, so that `revert_allocate_generation` undoes exactly this allocation.
    pub fn allocate_generation(&mut self, id: u64, num_draft_tokens: usize) -> KvResult<bool> {
        let seq = self.active_sequence(id)?;
        if seq.life.capacity < seq.num_tokens {
            return Err(KvError::InvalidArgument(format!(
                "sequence {id} has {} tokens but a capacity of {}: allocate its context first",
                seq.num_tokens, seq.life.capacity
            )));
        }
        let pre_capacity = seq.life.capacity;
        let wanted = self.capacity_sum(seq.num_tokens + 1, num_draft_tokens)?;
        let target = wanted.min(self.max_kv_tokens()).max(pre_capacity);
        let mut counted = CountedBlocks::default();
        if !self.resize_to(id, target, &mut counted)? {
            return Ok(false);
        }
        self.life_mut(id).generation = Some(GenerationAllocation {
            pre_capacity,
            num_draft_tokens,
            counted,
        });
        Ok(true)
    }

    /// Undoes the last `allocate_generation` (with its padding extensions): the capacity goes
    /// back to what it was before it, and the blocks it took leave the statistics. Returns
    /// whether there was one to undo: the step's first `add_token` consumes the allocation (the
    /// tokens it reserved slots for are arriving), so a revert after it changes nothing. Never
    /// needs a free block.
    pub fn revert_allocate_generation(&mut self, id: u64) -> KvResult<bool> {
        let seq = self.active_sequence(id)?;
        let Some(alloc) = &seq.life.generation else {
            return Ok(false);
        };
        debug_assert!(
            seq.num_tokens <= alloc.pre_capacity,
            "add_token clears the record"
        );
        let target = alloc.pre_capacity.max(seq.life.floor());
        self.resize_to(id, target, &mut CountedBlocks::default())?;
        let alloc = self.life_mut(id).generation.take().expect("checked");
        self.uncount(&alloc.counted);
        Ok(true)
    }

    /// Extends a sequence's capacity by `num_tokens` padding tokens (a CUDA graph pads the
    /// draft tokens of a step to a fixed count; the KV cache must cover the padded length so
    /// that the later rewind matches). Counts as draft tokens of the recorded generation
    /// allocation, so its revert undoes the padding too. `Ok(false)` when the blocks cannot be
    /// had (nothing changed); `SequenceTooLong` past `max_kv_tokens` (or when the sum overflows).
    pub fn extend_capacity_for_tokens(&mut self, id: u64, num_tokens: usize) -> KvResult<bool> {
        let seq = self.active_sequence(id)?;
        let target = self.capacity_sum(seq.life.capacity, num_tokens)?;
        let mut counted = CountedBlocks::default();
        if !self.resize_to(id, target, &mut counted)? {
            return Ok(false);
        }
        if let Some(g) = &mut self.life_mut(id).generation {
            g.num_draft_tokens += num_tokens;
            g.counted.merge(&counted);
        }
        Ok(true)
    }

    /// The context allocation of a chunked prefill: grows the capacity to cover the next
    /// `num_tokens` tokens past the history (never shrinks; `SequenceTooLong` past
    /// `max_kv_tokens` or when the sum overflows). Each call is a new scheduling iteration: it
    /// forgets the previous iteration's record (admission's included), and records the
    /// capacity before only when it grew — no growth this iteration, nothing to revert (seed
    /// 001). `Ok(false)` when the blocks cannot be had (the capacity is unchanged; the stale
    /// record is forgotten all the same).
    pub fn allocate_context(&mut self, id: u64, num_tokens: usize) -> KvResult<bool> {
        let seq = self.active_sequence(id)?;
        let pre_capacity = seq.life.capacity;
        let target = self.capacity_sum(seq.life.history, num_tokens)?;
        self.life_mut(id).context = None;
        if target <= pre_capacity {
            return Ok(true);
        }
        let mut counted = CountedBlocks::default();
        if !self.resize_to(id, target, &mut counted)? {
            return Ok(false);
        }
        self.life_mut(id).context = Some(ContextAllocation {
            pre_capacity,
            counted,
        });
        Ok(true)
    }

    /// Undoes this iteration's context allocation of a request whose prefill the scheduler
    /// deferred (delay batching), so its fresh blocks do not sit idle. Nothing to do (and
    /// `NothingToRevert`) if no context allocation grew the capacity this iteration, if it was
    /// already reverted, or once prefill is over (the sequence is generating). If prefill
    /// already computed past the old capacity the sequence cannot shrink, so it is stored for
    /// reuse (what was computed) and released (the caller restarts prefill); otherwise it
    /// shrinks back (never needing a free block), is suspended, and the allocation's blocks
    /// leave the statistics.
    pub fn revert_allocate_context(&mut self, id: u64) -> KvResult<ContextRevert> {
        let seq = self.sequence(id)?;
        let Some(alloc) = &seq.life.context else {
            return Ok(ContextRevert::NothingToRevert);
        };
        if seq.num_tokens > seq.input_length || seq.life.history >= seq.input_length {
            // Prefill is over: the allocation was consumed, nothing of it is left to revert.
            self.life_mut(id).context = None;
            return Ok(ContextRevert::NothingToRevert);
        }
        if seq.life.suspended {
            return Err(KvError::SequenceSuspended(id));
        }
        let pre_capacity = alloc.pre_capacity;
        if seq.life.history > pre_capacity || seq.life.floor() > pre_capacity {
            let computed = seq.life.history.min(seq.input_length);
            self.store_context_blocks(id, computed)?;
            self.remove_sequence(id, false)?;
            return Ok(ContextRevert::Released);
        }
        self.resize_to(id, pre_capacity, &mut CountedBlocks::default())?;
        let life = self.life_mut(id);
        let alloc = life.context.take().expect("checked");
        life.generation = None;
        self.uncount(&alloc.counted);
        self.suspend(id)?;
        Ok(ContextRevert::ShrunkAndSuspended)
    }

    /// Advances the history (tokens whose KV is computed) of a sequence: it never decreases and
    /// stays within the capacity and the known tokens.
    pub fn advance_history(&mut self, id: u64, history: usize) -> KvResult<()> {
        let seq = self.sequence(id)?;
        let limit = seq.life.capacity.min(seq.num_tokens);
        if history > limit {
            return Err(KvError::InvalidArgument(format!(
                "history {history} beyond the {limit} tokens sequence {id} has slots and ids for"
            )));
        }
        let life = self.life_mut(id);
        life.history = life.history.max(history);
        Ok(())
    }

    /// Suspends an active sequence: every block it holds becomes movable to the host tier but
    /// never droppable. Nothing moves now; blocks move when an allocation needs GPU rows.
    pub fn suspend(&mut self, id: u64) -> KvResult<()> {
        self.active_sequence(id)?;
        for w in &mut self.windows {
            w.suspend(id);
        }
        self.life_mut(id).suspended = true;
        Ok(())
    }

    /// The GPU utilization `resume` is gated on: the maximum over windows of (total − free −
    /// movable) / total, movable counting suspended sequences' blocks that could go to the
    /// host tier.
    pub fn gpu_utilization(&self) -> f64 {
        self.windows
            .iter()
            .map(|w| w.utilization())
            .fold(0.0, f64::max)
    }

    /// Resumes a suspended sequence: all its blocks back on the GPU, or nothing. Returns
    /// `Ok(false)` with no side effects when the GPU utilization is above the configured
    /// threshold or the blocks cannot all come back.
    pub fn resume(&mut self, id: u64) -> KvResult<bool> {
        if !self.sequence(id)?.life.suspended {
            return Err(KvError::InvalidArgument(format!(
                "sequence {id} is not suspended"
            )));
        }
        if self.gpu_utilization() > self.cfg.max_utilization_for_resume {
            return Ok(false);
        }
        if self.windows.iter().any(|w| !w.can_resume(id)) {
            return Ok(false);
        }
        let now = self.op_now_ms();
        for w in &mut self.windows {
            w.resume(id, now);
            absorb(&mut self.events, w);
        }
        self.life_mut(id).suspended = false;
        Ok(true)
    }

    /// Lifecycle bookkeeping of storing a sequence: `computed` tokens have KV, the first
    /// `committed` of them (whole blocks) are in the reuse tree.
    pub(super) fn note_stored(&mut self, id: u64, committed: usize, computed: usize) {
        let life = self.life_mut(id);
        life.committed = life.committed.max(committed);
        life.history = life.history.max(life.committed).max(computed);
    }

    /// Lifecycle bookkeeping of a rewind to `num_tokens`.
    pub(super) fn note_rewound(&mut self, id: u64, num_tokens: usize) {
        let tpb = self.cfg.tokens_per_block;
        let life = self.life_mut(id);
        life.capacity = num_tokens;
        life.history = life.history.min(num_tokens);
        life.committed = life
            .committed
            .min(num_tokens / tpb * tpb)
            .max(life.reused.min(num_tokens));
        life.generation = None;
    }

    /// Checks that sequence `id` (`seq`) can take V1 token calls: active and fully allocated.
    pub(super) fn check_generating(id: u64, seq: &super::Sequence) -> KvResult<()> {
        if seq.life.receiving {
            return Err(KvError::SequenceReceiving(id));
        }
        if seq.life.suspended {
            return Err(KvError::SequenceSuspended(id));
        }
        if seq.life.capacity < seq.num_tokens {
            return Err(KvError::InvalidArgument(format!(
                "sequence {id} has {} tokens but a capacity of {}: allocate its context first",
                seq.num_tokens, seq.life.capacity
            )));
        }
        Ok(())
    }

    /// Checks the lifecycle invariants of one sequence: `reused ≤ committed ≤ history ≤
    /// capacity`, history within the known tokens, exactly the tokens past the capacity kept.
    pub(super) fn verify_lifecycle(&self, id: u64) -> Result<(), String> {
        let s = &self.sequences[&id];
        let l = &s.life;
        if !(l.reused <= l.committed && l.committed <= l.history && l.history <= l.capacity) {
            return Err(format!(
                "sequence {id}: lengths out of order (reused {}, committed {}, history {}, \
                 capacity {})",
                l.reused, l.committed, l.history, l.capacity
            ));
        }
        if l.history > s.num_tokens {
            return Err(format!(
                "sequence {id}: history {} beyond its {} tokens",
                l.history, s.num_tokens
            ));
        }
        let pending = s.num_tokens.saturating_sub(l.capacity);
        let kept = if self.cfg.enable_block_reuse {
            pending
        } else {
            0
        };
        if l.pending_tokens.len() != kept {
            return Err(format!(
                "sequence {id}: {} tokens kept past the capacity, {kept} expected",
                l.pending_tokens.len()
            ));
        }
        for w in &self.windows {
            if w.is_suspended(id) != l.suspended {
                return Err(format!(
                    "sequence {id}: suspended is {} but window {} says {}",
                    l.suspended,
                    w.window_size(),
                    w.is_suspended(id)
                ));
            }
        }
        Ok(())
    }

    /// The capacity a V1 store may read up to (the tokens in blocks).
    pub(super) fn stored_limit(&self, id: u64) -> usize {
        let s = &self.sequences[&id];
        s.num_tokens.min(s.life.capacity)
    }
}
