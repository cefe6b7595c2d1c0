//! Scheduling simulation and the scheduler's block estimates (TensorRT-LLM's capacity
//! scheduler queries).

use super::{KvCacheManager, Request};
use crate::error::{KvError, KvResult};
use crate::sizing;

/// Where a request is in its life, for the scheduler estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPhase {
    /// Before its first context chunk.
    ContextInit,
    /// Between context chunks.
    ContextContinue,
    /// Generating.
    Generation,
    /// Finished or otherwise idle.
    Other,
}

/// Scheduler-side state of a request (what TensorRT-LLM reads from `LlmRequest`).
#[derive(Clone, Copy, Debug)]
pub struct RequestState {
    pub request_id: u64,
    pub phase: RequestPhase,
    pub prompt_len: usize,
    pub beam_width: usize,
    pub context_chunk_size: usize,
    pub num_draft_tokens: usize,
    pub max_new_tokens: usize,
    pub num_generated_tokens: usize,
}

impl KvCacheManager {
    pub fn start_scheduling(&mut self) {
        for w in &mut self.windows {
            w.start_scheduling();
        }
    }

    pub fn scheduling_remove_sequence(&mut self, id: u64) -> KvResult<()> {
        self.sequence(id)?;
        for w in &mut self.windows {
            w.scheduling_remove_sequence(id);
        }
        Ok(())
    }

    pub fn scheduling_has_free_blocks(&self, n: usize, window_size: usize) -> KvResult<bool> {
        Ok(self.window(window_size)?.scheduling_free_blocks() >= n)
    }

    /// Blocks the next step of a request needs in one window (TensorRT-LLM
    /// `getNeededBlocksOneStep`). With reuse on and `request` given, a first context chunk does
    /// not count blocks already referenced by other sequences.
    pub fn needed_blocks_one_step(
        &mut self,
        state: &RequestState,
        request: Option<&Request>,
        two_steps_look_ahead: bool,
        window_size: usize,
    ) -> KvResult<usize> {
        request.map(check_prompt_keys).transpose()?;
        let reuse = request.map_or(ReuseHint::Unknown, ReuseHint::Walk);
        self.needed_one_step(state, reuse, two_steps_look_ahead, window_size)
    }

    /// `needed_blocks_one_step` with the reuse of an earlier `analyze_prefix_reuse` of the
    /// request (TensorRT-LLM's `cachedSummary`): `reusable_allocated` full prompt blocks held
    /// by other sequences, so the tree is not walked again.
    pub fn needed_blocks_one_step_cached(
        &mut self,
        state: &RequestState,
        reusable_allocated: usize,
        two_steps_look_ahead: bool,
        window_size: usize,
    ) -> KvResult<usize> {
        let reuse = ReuseHint::Known(reusable_allocated);
        self.needed_one_step(state, reuse, two_steps_look_ahead, window_size)
    }

    fn needed_one_step(
        &mut self,
        state: &RequestState,
        reuse: ReuseHint<'_>,
        two_steps_look_ahead: bool,
        window_size: usize,
    ) -> KvResult<usize> {
        let wi = self.window_index(window_size)?;
        let tpb = self.cfg.tokens_per_block;
        let beam = state.beam_width.max(1);
        match state.phase {
            RequestPhase::ContextInit => {
                let len = (state.prompt_len + state.num_draft_tokens)
                    .min(window_size.saturating_add(state.context_chunk_size));
                let shared = len / tpb;
                let unshared = usize::from(!len.is_multiple_of(tpb)) * beam;
                let reusable = if self.cfg.enable_block_reuse && self.windows.len() == 1 {
                    self.reusable_allocated(wi, reuse).min(shared)
                } else {
                    0
                };
                Ok(shared + unshared - reusable)
            }
            RequestPhase::Generation => {
                let seq = self.sequence(state.request_id)?;
                // KV slots, as TensorRT-LLM's sequence counts them: `addToken` reserves a slot
                // before the token id arrives, so the capacity may lead the known tokens.
                let current = seq.num_tokens.max(seq.life.capacity);
                let steps = if two_steps_look_ahead { 2 } else { 1 };
                let add = (steps * (state.num_draft_tokens + 1)).min(
                    state
                        .max_new_tokens
                        .saturating_sub(state.num_generated_tokens),
                );
                let max_token_num = self.windows[wi].config().max_token_num;
                if current + add > max_token_num {
                    return Ok(0);
                }
                Ok(((current + add).div_ceil(tpb) - current.div_ceil(tpb)) * beam)
            }
            _ => Ok(0),
        }
    }

    /// Blocks a request still needs in one window until it completes (TensorRT-LLM
    /// `getRemainingBlocksToCompletion`); reusable blocks already referenced by other
    /// sequences are not counted for a request not yet admitted.
    pub fn remaining_blocks_to_completion(
        &mut self,
        state: &RequestState,
        request: Option<&Request>,
        window_size: usize,
    ) -> KvResult<usize> {
        request.map(check_prompt_keys).transpose()?;
        let reuse = request.map_or(ReuseHint::Unknown, ReuseHint::Walk);
        self.remaining_to_completion(state, reuse, window_size)
    }

    /// `remaining_blocks_to_completion` with the reuse of an earlier `analyze_prefix_reuse`
    /// (TensorRT-LLM's `cachedSummary`).
    pub fn remaining_blocks_to_completion_cached(
        &mut self,
        state: &RequestState,
        reusable_allocated: usize,
        window_size: usize,
    ) -> KvResult<usize> {
        self.remaining_to_completion(state, ReuseHint::Known(reusable_allocated), window_size)
    }

    fn remaining_to_completion(
        &mut self,
        state: &RequestState,
        reuse: ReuseHint<'_>,
        window_size: usize,
    ) -> KvResult<usize> {
        let wi = self.window_index(window_size)?;
        let tpb = self.cfg.tokens_per_block;
        let beam = state.beam_width.max(1);
        let final_tokens = state.prompt_len + state.max_new_tokens;
        // Admission allocates the whole prompt, also in a sliding window (blocks that leave
        // the window are detached only while generating), so the prompt is never capped by
        // the window here (TensorRT-LLM caps it, which undercounts long prompts). The blocks
        // held at once are capped by the window and the tokens a context chunk may add past
        // it (TensorRT-LLM's temporary attention window).
        let cap = window_size.saturating_add(self.temporary_attention_window(window_size));
        let context_blocks = state.prompt_len / tpb;
        let total_blocks = final_tokens.min(cap).max(state.prompt_len).div_ceil(tpb);
        let generation_blocks = total_blocks - context_blocks;
        // A window that slides allocates a block before the one leaving it is freed: one block
        // more, when the sequence still crosses a block boundary past the capped extent.
        let final_blocks = final_tokens.div_ceil(tpb);
        let current_blocks = (state.prompt_len + state.num_generated_tokens).div_ceil(tpb);
        let extra = usize::from(
            final_tokens > window_size
                && final_blocks > current_blocks
                && final_blocks > total_blocks,
        );
        let allocated = self.windows[wi]
            .block_ids(state.request_id, 0)
            .map_or(0, |ids| ids.len());
        let reusable = if allocated == 0 && self.cfg.enable_block_reuse {
            self.reusable_allocated(wi, reuse).min(context_blocks)
        } else {
            0
        };
        if allocated < context_blocks {
            Ok(context_blocks - allocated - reusable + (generation_blocks + extra) * beam)
        } else {
            Ok((total_blocks.saturating_sub(allocated) + extra) * beam)
        }
    }

    /// Tokens past a sliding window that a context chunk may hold at once (TensorRT-LLM's
    /// temporary attention window): at most a chunk, at most what the longest sequence has
    /// past the window; 0 when no chunk size was given.
    fn temporary_attention_window(&self, window_size: usize) -> usize {
        let chunk = self.cfg.max_context_chunk_tokens;
        let longest = self.cfg.max_sequence_length;
        if chunk == 0 || longest <= window_size {
            return 0;
        }
        chunk.min(longest - window_size)
    }

    /// Sets `max_context_chunk_tokens` (see `ManagerConfig`); only the estimates read it.
    pub fn set_max_context_chunk_tokens(&mut self, tokens: usize) {
        self.cfg.max_context_chunk_tokens = tokens;
    }

    /// Full prompt blocks held by other sequences that admission would reuse, per `reuse`.
    fn reusable_allocated(&mut self, wi: usize, reuse: ReuseHint<'_>) -> usize {
        match reuse {
            // A request that opts out of reuse allocates every block of its prompt.
            ReuseHint::Walk(r) if r.disable_reuse => 0,
            ReuseHint::Walk(r) => {
                let src = r.key_source();
                self.windows[wi].count_reusable_blocks(&src, r.input_length, true)
            }
            ReuseHint::Known(n) => n,
            ReuseHint::Unknown => 0,
        }
    }

    /// Consecutive full prompt blocks of `request` found in one window's tree.
    pub fn count_reusable_blocks(
        &mut self,
        request: &Request,
        window_size: usize,
        only_allocated: bool,
    ) -> KvResult<usize> {
        let wi = self.window_index(window_size)?;
        check_prompt_keys(request)?;
        let src = request.key_source();
        Ok(self.windows[wi].count_reusable_blocks(&src, request.input_length, only_allocated))
    }

    /// Most requests of `input + output` tokens the primary pools can hold at once.
    pub fn max_capacity_batch_size(&self, input: usize, output: usize) -> usize {
        self.windows
            .iter()
            .map(|w| {
                let c = w.config();
                c.num_primary
                    / sizing::max_block_requirements(
                        input,
                        output,
                        c.window_size,
                        self.cfg.max_beam_width,
                        c.tokens_per_block,
                    )
                    .max(1)
            })
            .min()
            .unwrap_or(0)
    }
}

/// A request whose prompt keys are read (reuse counts) must hold `input_length` tokens and, when
/// it has extra ids, as many of them: otherwise the key of its last block reads past the end.
/// Where the estimates get the reuse of a request not yet admitted.
#[derive(Clone, Copy)]
enum ReuseHint<'a> {
    /// Walk the tree along the request's prompt.
    Walk(&'a Request),
    /// A count from an earlier walk (`analyze_prefix_reuse`).
    Known(usize),
    /// No request: no reuse is counted.
    Unknown,
}

pub(super) fn check_prompt_keys(request: &Request) -> KvResult<()> {
    if request.token_ids.len() < request.input_length {
        return Err(KvError::TooFewTokens {
            input_length: request.input_length,
            num_tokens: request.token_ids.len(),
        });
    }
    match &request.extra_ids {
        Some(extra) if extra.len() < request.input_length => {
            Err(KvError::InvalidArgument(format!(
                "{} token extra ids for input length {}",
                extra.len(),
                request.input_length
            )))
        }
        _ => Ok(()),
    }
}
