"""The request, statistics and summary types of :mod:`kvblock.trtllm`, and the conversions of an
engine's request into kvblock's own :class:`kvblock.Request` and :class:`kvblock.RequestState`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from . import _kvblock as _kvb


class CacheType:
    """TensorRT-LLM's cache types: self-attention K and V, cross-attention (the encoder's KV,
    never reused), and K only (MLA's latent)."""

    SELF = 0
    CROSS = 1
    SELFKONLY = 2


@dataclass
class LlmRequest:
    """What the facade reads from an engine's request, and writes back into it.

    Any object with these attributes works (TensorRT-LLM's ``LlmRequest`` binding included,
    given ``tokens`` through ``get_tokens``).
    """

    request_id: int
    tokens: List[List[int]]  # per beam: prompt, then generated tokens
    prompt_len: int
    max_new_tokens: int = 0
    context_current_position: int = 0
    is_context_init_state: bool = True
    is_generation_in_progress_state: bool = False
    context_chunk_size: int = 0  # 0: the whole prompt
    num_draft_tokens: int = 0
    beam_width: int = 1
    lora_task_id: Optional[int] = None
    cache_salt_id: Optional[int] = None
    token_extra_ids: Optional[List[int]] = None
    # Written by add_sequence_batch.
    prepopulated_prompt_len: int = 0
    alloc_total_blocks: int = 0
    alloc_new_blocks: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0

    @classmethod
    def from_prompt(cls, request_id: int, prompt: Sequence[int], max_new_tokens: int = 0):
        return cls(request_id, [list(prompt)], len(prompt), max_new_tokens)

    def get_tokens(self, beam: int) -> List[int]:
        return self.tokens[beam]

    def add_new_token(self, token: int) -> None:
        for beam in self.tokens:
            beam.append(token)


@dataclass
class PrefixReuseSummary:
    """TensorRT-LLM ``PrefixReuseSummary`` (``first_new_block``: an index, or None)."""

    reusable_blocks_allocated: int = 0
    reusable_blocks_all: int = 0
    first_new_block: Optional[int] = None


@dataclass
class KvCacheStats:
    """TensorRT-LLM ``KvCacheStats``: plain writable fields, as the executor adjusts some."""

    max_num_blocks: int = 0
    free_num_blocks: int = 0
    used_num_blocks: int = 0
    tokens_per_block: int = 0
    alloc_total_blocks: int = 0
    alloc_new_blocks: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0
    cache_hit_rate: float = 0.0
    num_free_blocks_per_window_size: Dict[int, int] = field(default_factory=dict)
    allocated_bytes: int = 0


def _kvb_request(req, request_id=None, input_length=None, beam_width=None, tokens=None):
    """kvblock's Request for an engine request (optionally overriding its fields)."""
    return _kvb.Request(
        req.request_id if request_id is None else request_id,
        list(req.get_tokens(0)) if tokens is None else tokens,
        input_length=req.prompt_len if input_length is None else input_length,
        beam_width=getattr(req, "beam_width", 1) if beam_width is None else beam_width,
        token_extra_ids=getattr(req, "token_extra_ids", None),
        lora_task_id=getattr(req, "lora_task_id", None),
        cache_salt=getattr(req, "cache_salt_id", None),
    )


def _state_of(req):
    """kvblock's RequestState of an engine request, for the scheduler's estimates."""
    if req.is_context_init_state:
        first = req.context_current_position == 0
        phase = _kvb.RequestPhase.CONTEXT_INIT if first else _kvb.RequestPhase.CONTEXT_CONTINUE
    elif req.is_generation_in_progress_state:
        phase = _kvb.RequestPhase.GENERATION
    else:
        phase = _kvb.RequestPhase.OTHER
    tokens = req.get_tokens(0)
    return _kvb.RequestState(
        req.request_id,
        phase=phase,
        prompt_len=req.prompt_len,
        beam_width=getattr(req, "beam_width", 1),
        context_chunk_size=req.context_chunk_size or req.prompt_len,
        num_draft_tokens=req.num_draft_tokens,
        max_new_tokens=req.max_new_tokens,
        num_generated_tokens=len(tokens) - req.prompt_len,
    )
