"""TensorRT-LLM's 2026 ``KVCacheManager`` binding surface over kvblock.

``kvblock.trtllm.KVCacheManager`` has the method names, argument orders and return shapes the
PyTorch executor (``resource_manager.py``) calls on TensorRT-LLM's C++ manager binding, so those
call sites port by swapping the object. Where kvblock's own :class:`kvblock.KVCacheManager`
means something else under the same name, this class gives TensorRT-LLM's meaning:

* ``add_token(request_id)`` reserves one KV slot without a token; ``get_token_count`` counts
  reserved slots. Token ids arrive later from the request object whenever the facade is handed
  it (``store_context_blocks``, ``store_new_block``, ``store_blocks_for_reuse``,
  ``remove_sequence``, ``commit_and_get_block_hashes_for_request``, ``sync_tokens``).
* ``remove_sequence(request_id, llm_request=None, pin_on_release=False)``: an unknown id does
  nothing; passing the request means "store for reuse".
* ``get_priority_by_block_id(block_id, window_size)``; ``unpin_blocks_by_id(block_ids)``;
  ``get_cache_block_ids`` returns ``[beam][block]``.
* ``max_sequence_length`` includes the extra KV tokens and draft tokens.
* ``copy_linear_attention_block(_batch)`` also copies at decode block boundaries (kvblock keeps a
  recurrent-state row in every block, so decode blocks stored for reuse need their snapshots).

The engine's request is read duck-typed; :class:`LlmRequest` lists what is read and written.
kvblock's own manager stays reachable as :attr:`KVCacheManager.impl`.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _kvblock as _kvb
from ._trtllm_types import (
    CacheType,
    KvCacheStats,
    LlmRequest,
    PrefixReuseSummary,
    _kvb_request,
    _state_of,
)

__all__ = [
    "CacheType",
    "KVCacheManager",
    "KvCacheStats",
    "LlmRequest",
    "PrefixReuseSummary",
]


class KVCacheManager:
    """TensorRT-LLM's ``KVCacheManager`` binding (2026) over kvblock.

    The keyword arguments are those ``resource_manager.py`` passes; ``dtype_bytes`` stands for
    ``dtype``. Layer ``l`` attends over ``max_attention_window_vec[l % len(...)]`` with
    ``num_kv_heads_per_layer[l]`` heads; ``cache_type`` is :class:`CacheType`'s, and
    ``kv_data_type`` (a :class:`kvblock.KvDataType`: FP8, NVFP4 with block-scale pools, ...)
    stands for a quantized ``dtype``. Layers of other heads, cache types or element types are
    grouped into pools by window and shape, as TensorRT-LLM groups them. ``kv_connector_manager``
    is TensorRT-LLM's KV-cache connector (any object with ``get_num_new_matched_tokens(request,
    num_computed_tokens)``): at admission its tokens past the reused prefix are added to the
    prepopulated length (never the last prompt token); it is asked before admitting, so one that
    raises admits nothing. kvblock-only settings: ``num_extra_kv_tokens``,
    ``max_draft_tokens`` (parts of ``max_sequence_length``), ``copy_backend``, ``manual_clock``.
    """

    def __init__(
        self,
        *,
        num_kv_heads_per_layer: Sequence[int],
        size_per_head: int,
        tokens_per_block: int,
        blocks_per_window: Dict[int, Tuple[int, int]],
        max_num_sequences: int,
        max_beam_width: int,
        max_attention_window_vec: Sequence[int],
        dtype_bytes: int = 2,
        sink_token_length: int = 0,
        stream: int = 0,
        max_sequence_length: int,
        chunk_size: int = 0,
        enable_block_reuse: bool = False,
        cache_type: int = CacheType.SELF,
        secondary_offload_min_priority: Optional[int] = None,
        max_kv_event_entries: int = 0,
        attention_dp_rank: Optional[int] = None,
        enable_partial_reuse: bool = True,
        copy_on_partial_reuse: bool = True,
        kv_connector_manager=None,
        num_extra_kv_tokens: int = 0,
        max_draft_tokens: int = 0,
        copy_backend=None,
        manual_clock: bool = False,
        kv_data_type=None,
        enable_indexer_k_cache: bool = False,
        indexer_k_cache_quant_block_size: int = 128,
        indexer_k_cache_index_head_dim: int = 0,
        indexer_k_cache_use_fp4: bool = False,
        indexer_k_cache_layer_mask: Optional[Sequence[bool]] = None,
        extra_layers: Optional[Sequence["_kvb.LayerSpec"]] = None,
    ):
        del max_num_sequences  # kvblock bounds sequences by blocks only
        # The remaining-blocks estimate of a sliding window counts a chunk's tokens past it
        # (TensorRT-LLM's temporary attention window).
        self._chunk_size = chunk_size
        if sink_token_length:
            raise _kvb.UnsupportedError("sink tokens are not supported")
        kinds = {
            CacheType.SELF: _kvb.CacheType.SELF,
            CacheType.CROSS: _kvb.CacheType.CROSS,
            CacheType.SELFKONLY: _kvb.CacheType.SELF_K_ONLY,
        }
        if cache_type not in kinds:
            raise _kvb.InvalidConfigError(f"unknown cache type {cache_type}")
        window_of = [
            max_attention_window_vec[layer % len(max_attention_window_vec)]
            for layer in range(len(num_kv_heads_per_layer))
        ]
        windows = []
        uniform = True
        for window, (primary, secondary) in sorted(blocks_per_window.items()):
            heads = {h for h, w in zip(num_kv_heads_per_layer, window_of) if w == window}
            if not heads:
                raise _kvb.InvalidConfigError(f"window {window} has no layer")
            uniform = uniform and len(heads) == 1
            windows.append(
                _kvb.WindowConfig(
                    window,
                    primary,
                    secondary,
                    num_layers=sum(1 for w in window_of if w == window),
                    num_kv_heads=max(heads),
                    size_per_head=size_per_head,
                )
            )
        # Per-layer heads, another cache type or a quantized element type: the pool model, which
        # groups layers into pools by window and shape as TensorRT-LLM does.
        layers = []
        if (not uniform or cache_type != CacheType.SELF or kv_data_type is not None
                or enable_indexer_k_cache or extra_layers):
            data_type = _kvb.KvDataType.DEFAULT if kv_data_type is None else kv_data_type
            layers = [
                _kvb.LayerSpec(w, kinds[cache_type], h, size_per_head, data_type)
                for h, w in zip(num_kv_heads_per_layer, window_of)
            ]
        self._indexer = None
        if enable_indexer_k_cache:
            layers += self._indexer_layers(window_of, indexer_k_cache_index_head_dim,
                                           indexer_k_cache_quant_block_size, indexer_k_cache_use_fp4,
                                           indexer_k_cache_layer_mask)
        # kvblock layers TensorRT-LLM's constructor has no argument for, after the model's (a
        # hybrid model's recurrent-state layers, which its Mamba cache manager adds).
        layers += list(extra_layers or [])
        self._num_model_layers = len(num_kv_heads_per_layer)
        config = _kvb.ManagerConfig(
            windows,
            tokens_per_block=tokens_per_block,
            max_beam_width=max_beam_width,
            max_sequence_length=max_sequence_length - num_extra_kv_tokens - max_draft_tokens,
            num_extra_kv_tokens=num_extra_kv_tokens,
            max_draft_tokens=max_draft_tokens,
            enable_block_reuse=enable_block_reuse,
            enable_partial_reuse=enable_partial_reuse,
            copy_on_partial_reuse=copy_on_partial_reuse,
            bytes_per_element=dtype_bytes,
            max_kv_event_entries=max_kv_event_entries,
            manual_clock=manual_clock,
        )
        if layers:
            config.layers = layers
        self._cache_type = cache_type
        if secondary_offload_min_priority is not None:
            config.secondary_offload_min_priority = secondary_offload_min_priority
        if copy_backend is not None:
            config.copy_backend = copy_backend
        if stream:
            config.cuda_stream = stream
        config.attention_dp_rank = attention_dp_rank
        self._config = config
        self._windows = sorted(blocks_per_window)
        self._impl: Optional[_kvb.KVCacheManager] = None
        self._pins: List[Tuple[List[int], List[Tuple[int, List[int]]]]] = []
        self._pin_lock = threading.Lock()
        # TensorRT-LLM's KV-cache connector: ``get_num_new_matched_tokens(request, computed)``.
        self._connector = kv_connector_manager

    def _indexer_layers(self, window_of, head_dim, quant_block, use_fp4, mask):
        """TensorRT-LLM's indexer K cache (DeepSeek-V3.2's sparse attention) as K-only
        ``INDEXER_K`` layers after the model's: per token, ``head_dim`` FP8 elements then one
        FP32 scale per ``quant_block`` of them (FP4: kvblock's NVFP4, quant blocks of 16)."""
        if head_dim <= 0 or quant_block <= 0 or head_dim % quant_block:
            raise _kvb.InvalidConfigError(
                "the indexer K cache needs a positive head dim that is a multiple of its quant block size")
        if use_fp4 and quant_block != 16:
            raise _kvb.UnsupportedError("an FP4 indexer K cache takes kvblock's NVFP4 layout: quant blocks of 16")
        if mask is not None and len(mask) != len(window_of):
            raise _kvb.InvalidConfigError("indexer_k_cache_layer_mask needs one entry per layer")
        self._indexer = (head_dim, quant_block, use_fp4)
        size, dtype = ((head_dim, _kvb.KvDataType.NVFP4) if use_fp4
                       else (head_dim + head_dim // quant_block * 4, _kvb.KvDataType.FP8))
        return [_kvb.LayerSpec(w, _kvb.CacheType.INDEXER_K, 1, size, dtype)
                for layer, w in enumerate(window_of) if mask is None or mask[layer]]

    # --- the indexer K cache ----------------------------------------------------------
    @property
    def enable_indexer_k_cache(self) -> bool:
        return self._indexer is not None

    @property
    def indexer_k_cache_index_head_dim(self) -> int:
        return self._indexer[0] if self._indexer else 0

    @property
    def indexer_k_cache_quant_block_size(self) -> int:
        return self._indexer[1] if self._indexer else 0

    @property
    def indexer_k_cache_use_fp4(self) -> bool:
        return bool(self._indexer and self._indexer[2])

    def _indexer_pool(self) -> int:
        for p in range(self.impl.get_num_pools(False)):
            if self.impl.get_pool_info(p).cache_type == _kvb.CacheType.INDEXER_K:
                return p
        raise _kvb.UnsupportedError("this manager has no indexer K cache")

    def get_indexer_k_cache_pool(self):
        """The indexer K cache pool (``[blocks, indexer layers, 1, 1, tokens, bytes per token]``,
        a zero-copy view: :meth:`kvblock.KVCacheManager.model_pool_view`); after the KV pools."""
        return self.impl.model_pool_view(self._indexer_pool())

    def get_indexer_k_cache_pool_data(self, layer_idx: int):
        """``[blocks, tokens x bytes per token]`` of the indexer layer ``layer_idx`` (among the
        layers that have one), host pools (numpy); per token its FP8 elements, then its scales."""
        pool = self.get_indexer_k_cache_pool()
        return pool[:, layer_idx].reshape(pool.shape[0], -1)

    # --- pools ------------------------------------------------------------------------
    def allocate_pools(self, use_uvm: bool = False) -> None:
        if use_uvm:
            raise _kvb.UnsupportedError("unified memory pools")
        if self._impl is None:
            self._impl = _kvb.KVCacheManager(self._config)
            if self._chunk_size:
                self._impl.set_max_context_chunk_tokens(self._chunk_size)

    def release_pools(self) -> None:
        if self._impl is not None:
            self._impl.close()
            self._impl = None
        self._pins.clear()

    @property
    def impl(self) -> _kvb.KVCacheManager:
        """kvblock's own manager (e.g. its token-carrying ``add_token(id, token)``)."""
        if self._impl is None:
            raise _kvb.InvalidArgumentError("call allocate_pools() first")
        return self._impl

    # --- properties the executor reads -----------------------------------------------
    @property
    def tokens_per_block(self) -> int:
        return self._config.tokens_per_block

    @property
    def max_num_blocks(self) -> int:
        return self.impl.get_kv_cache_stats().max_num_blocks

    @property
    def num_pools(self) -> int:
        return self.impl.get_offset_table_dimensions()[1]

    @property
    def max_blocks_per_seq(self) -> int:
        return self.impl.get_offset_table_dimensions()[0]

    @property
    def is_variable_window(self) -> bool:
        return len(self._windows) > 1

    @property
    def enable_block_reuse(self) -> bool:
        return self._config.enable_block_reuse

    @property
    def enable_partial_reuse(self) -> bool:
        return self._config.enable_partial_reuse

    @property
    def cross_kv(self) -> bool:
        return self._cache_type == CacheType.CROSS

    # --- pools: TensorRT-LLM's pool tensors, as numpy arrays --------------------------
    @property
    def pool_configurations(self) -> List["_kvb.PoolInfo"]:
        """One :class:`kvblock.PoolInfo` per data pool, in offset-table order."""
        return [self.impl.get_pool_info(p) for p in range(self.impl.get_num_pools(False))]

    def _pool_address(self, pool: int, level) -> int:
        try:
            return self.impl.get_model_pool_pointer(pool, level)[0]
        except _kvb.UnsupportedError:  # no memory at that level (no host tier)
            return 0

    def get_block_pool_pointers(self):
        """``int64 [pools, 2]``: each data pool's primary and host-tier base address (0: none;
        the indexer K cache pools last)."""
        levels = (_kvb.CacheLevel.PRIMARY, _kvb.CacheLevel.SECONDARY)
        rows = [[self._pool_address(p, lv) for lv in levels] for p in range(self.impl.get_num_pools(False))]
        return np.array(rows, dtype=np.int64).reshape(-1, 2)

    def get_block_scale_pool_pointers(self):
        """``int64 [pools, 2]``: each data pool's block-scale pool (primary, host; 0: none)."""
        primary = self.impl.get_block_scale_pool_pointers(_kvb.CacheLevel.PRIMARY)
        secondary = self.impl.get_block_scale_pool_pointers(_kvb.CacheLevel.SECONDARY)
        return np.array(list(zip(primary, secondary)), dtype=np.int64).reshape(-1, 2)

    def get_layer_to_pool_mapping(self):
        """``int32 [layers, 2]``: each layer's pool and its index among that pool's layers."""
        mapping = self.impl.get_layer_to_pool_mapping()[: self._num_model_layers]
        return np.array(mapping, dtype=np.int32).reshape(-1, 2)

    def get_primary_pool_data(self, layer_idx: int):
        """The primary pool holding layer ``layer_idx`` (a zero-copy view of the pool:
        :meth:`kvblock.KVCacheManager.model_pool_view`); the layer is index
        ``get_layer_to_pool_mapping()[layer_idx][1]`` of its layer axis."""
        pool = int(self.get_layer_to_pool_mapping()[layer_idx][0])
        return self.impl.model_pool_view(pool)

    def get_unique_primary_pool(self):
        """The primary pool of a model with exactly one pool (``UnsupportedError`` otherwise)."""
        if self.impl.get_num_pools(False) != 1:
            raise _kvb.UnsupportedError("get_unique_primary_pool needs exactly one pool")
        return self.impl.model_pool_view(0)

    @property
    def first_window_size(self) -> int:
        return self._windows[0]

    @property
    def last_window_size(self) -> int:
        return self._windows[-1]

    def get_num_free_blocks(self) -> int:
        return self.impl.get_num_free_blocks()

    def get_num_free_blocks_per_window_size(self) -> Dict[int, int]:
        return {w: self.impl.get_num_free_blocks_per_window_size(w)[0] for w in self._windows}

    def get_kv_cache_stats(self) -> KvCacheStats:
        s = self.impl.get_kv_cache_stats()
        return KvCacheStats(
            max_num_blocks=s.max_num_blocks,
            free_num_blocks=s.free_num_blocks,
            used_num_blocks=s.used_num_blocks,
            tokens_per_block=s.tokens_per_block,
            alloc_total_blocks=s.alloc_total_blocks,
            alloc_new_blocks=s.alloc_new_blocks,
            reused_blocks=s.reused_blocks,
            missed_blocks=s.missed_blocks,
            cache_hit_rate=s.cache_hit_rate,
            num_free_blocks_per_window_size=self.get_num_free_blocks_per_window_size(),
            allocated_bytes=s.allocated_bytes,
        )

    def get_iteration_stats(self):
        """Per window size, the :class:`kvblock.IterationStats` since the previous call."""
        return self.impl.get_iteration_stats()

    # --- admission and tokens -------------------------------------------------------------
    def add_sequence_batch(self, request_infos, llm_requests) -> None:
        """Admits ``(request_id, input_length, beam_width)`` tuples with their requests and
        writes the prepopulated prompt length and block counts into each request."""
        if len(request_infos) != len(llm_requests):
            raise _kvb.InvalidArgumentError("request_infos and llm_requests differ in length")
        batch = [
            _kvb_request(req, request_id=rid, input_length=length, beam_width=beams)
            for (rid, length, beams), req in zip(request_infos, llm_requests)
        ]
        prepopulated = None
        if self._connector is not None:
            # Asked before admission, from the estimate (exactly what admission delivers): a
            # connector that raises admits nothing. Its tokens never reach the last prompt token.
            estimates = self.impl.estimate_batch(batch)
            prepopulated = []
            for (_, length, _), req, est in zip(request_infos, llm_requests, estimates):
                reused = est.reusable_tokens
                loaded = max(0, int(self._connector.get_num_new_matched_tokens(req, reused)))
                prepopulated.append(min(reused + loaded, max(reused, length - 1)))
        for i, (req, admission) in enumerate(zip(llm_requests, self.impl.add_sequence_batch(batch))):
            req.prepopulated_prompt_len = (admission.prepopulated_prompt_len
                                           if prepopulated is None else prepopulated[i])
            req.alloc_total_blocks += admission.stats.alloc_total_blocks
            req.alloc_new_blocks += admission.stats.alloc_new_blocks
            req.reused_blocks += admission.stats.reused_blocks
            req.missed_blocks += admission.stats.missed_blocks

    def add_token(self, request_id: int) -> None:
        """Reserves one KV slot (decode, extra KV or draft token); the token id comes later.

        In a sliding window the blocks that left the window of the new slot are released first.
        """
        if not self.impl.add_slot(request_id):
            raise _kvb.OutOfBlocksError("no free block for the new slot")

    def get_token_count(self, request_id: int) -> int:
        return self.impl.get_sequence_lengths(request_id).capacity

    def rewind_kv_cache(self, request_id: int, num_tokens: int) -> None:
        """Drops the last ``num_tokens`` slots: reserved ones first, then tokens."""
        lengths = self.impl.get_sequence_lengths(request_id)
        reserved = max(0, lengths.capacity - lengths.num_tokens)
        if num_tokens <= reserved:
            if num_tokens:
                self.impl.resize(request_id, lengths.capacity - num_tokens)
        else:
            self.impl.rewind_kv_cache(request_id, num_tokens - reserved)

    def remove_token(self, request_id: int) -> None:
        self.rewind_kv_cache(request_id, 1)

    def sync_tokens(self, llm_request, store_new_blocks: bool = False) -> None:
        """Gives the manager the request's token ids for the slots it has reserved."""
        rid = llm_request.request_id
        lengths = self.impl.get_sequence_lengths(rid)
        tokens = llm_request.get_tokens(0)
        for token in tokens[lengths.num_tokens : min(len(tokens), lengths.capacity)]:
            self.impl.add_token(rid, int(token))
            if store_new_blocks:
                self.impl.store_new_block(rid)

    # --- store, release, pins -----------------------------------------------------------
    def store_context_blocks(self, llm_request) -> None:
        self.impl.store_context_blocks(llm_request.request_id, llm_request.context_current_position)

    def store_new_block(self, llm_request) -> None:
        self.sync_tokens(llm_request, store_new_blocks=True)
        self.impl.store_new_block(llm_request.request_id)

    def store_blocks_for_reuse(self, request_id, llm_request=None, pin_blocks=False) -> List[int]:
        if llm_request is not None:
            self.sync_tokens(llm_request)
        self.impl.store_blocks_for_reuse(request_id)
        return self._pin_sequence(request_id) if pin_blocks else []

    def remove_sequence(self, request_id, llm_request=None, pin_on_release=False):
        """Releases a sequence (stored for reuse when the request is given); an unknown id does
        nothing. Returns the last block id of beam 0 when stored or pinned, else None."""
        if not self._holds(request_id):
            return None
        if llm_request is not None:
            self.sync_tokens(llm_request)
        last = None
        if llm_request is not None or pin_on_release:
            last = self.impl.get_last_block_id(request_id)
        if pin_on_release:
            self._pin_sequence(request_id)
        store = llm_request is not None and self._config.enable_block_reuse
        self.impl.remove_sequence(request_id, store)
        return last

    def _holds(self, request_id: int) -> bool:
        try:
            self.impl.get_sequence_lengths(request_id)
        except _kvb.UnknownRequestError:
            return False
        return True

    def pin_blocks(self, request_id: int) -> None:
        self._pin_sequence(request_id)

    def unpin_blocks_by_id(self, block_ids: Sequence[int]) -> None:
        ids = list(block_ids)
        with self._pin_lock:
            for i, (key, group) in enumerate(self._pins):
                if key == ids:
                    for window, window_ids in group:
                        self.impl.unpin_blocks_by_id(window, window_ids)
                    del self._pins[i]
                    return
        self.impl.unpin_blocks_by_id(self._windows[0], ids)

    def _pin_sequence(self, request_id: int) -> List[int]:
        group = []
        for w in self._windows:
            front = self.impl.get_num_front_blocks_removed(request_id, w)
            ids = []
            for beam in self.get_cache_block_ids(request_id, w):
                ids.extend(beam[front:])
            group.append((w, ids))
        first = self._windows[0]
        front = self.impl.get_num_front_blocks_removed(request_id, first)
        key = list(self.impl.get_cache_block_ids(request_id, first, 0))[front:]
        self.impl.pin_blocks(request_id)
        with self._pin_lock:
            self._pins.append((key, group))
        return key

    # --- block ids and offsets ----------------------------------------------------------
    def get_cache_block_ids(self, request_id: int, window_size: int) -> List[List[int]]:
        beams = self.impl.get_beam_width(request_id)
        return [list(self.impl.get_cache_block_ids(request_id, window_size, b)) for b in range(beams)]

    def get_batch_cache_block_ids(self, request_ids, window_size: int):
        return [self.get_cache_block_ids(rid, window_size) for rid in request_ids]

    def get_num_front_blocks_removed(self, request_id: int, window_size: int) -> int:
        return self.impl.get_num_front_blocks_removed(request_id, window_size)

    def get_last_block_id(self, request_id: int) -> Optional[int]:
        try:
            return self.impl.get_last_block_id(request_id)
        except _kvb.UnknownRequestError:
            return None

    def get_priority_by_block_id(self, block_id: int, window_size: int) -> int:
        return self.impl.get_priority_by_block_id(window_size, block_id)

    def get_memory_pool_block_indices(self, block_ids, window_size: int) -> List[int]:
        return self.impl.get_memory_pool_block_indices(list(block_ids), window_size)

    def copy_block_offsets(self, output, output_slot_offset: int, request_id: int) -> int:
        return self.impl.copy_block_offsets(output, output_slot_offset, request_id)

    def copy_batch_block_offsets(self, output, request_ids, beam_width: int, offset: int) -> None:
        """Request ``i``'s offsets at slots ``offset + i * beam_width`` of ``output``."""
        for i, rid in enumerate(request_ids):
            self.impl.copy_block_offsets(output, offset + i * beam_width, rid)

    # --- reuse --------------------------------------------------------------------------
    def analyze_prefix_reuse(self, unique_tokens, llm_request, window_size=None):
        """One walk of the tree (the largest window unless given) along ``unique_tokens``
        (ints, or ``(token, extra_id)`` pairs) keyed as ``llm_request``'s blocks."""
        tokens = [t[0] if isinstance(t, tuple) else int(t) for t in unique_tokens]
        req = _kvb_request(llm_request, tokens=tokens, input_length=len(tokens))
        window = self._windows[-1] if window_size is None else window_size
        s = self.impl.analyze_prefix_reuse(req, window)
        first = s.first_new_block_index if s.first_new_block_index >= 0 else None
        return PrefixReuseSummary(s.reusable_blocks_allocated, s.reusable_blocks_all, first)

    def get_needed_blocks_one_step(
        self, llm_request, two_steps_look_ahead: bool, window_size: int, cached_summary=None
    ) -> int:
        state = _state_of(llm_request)
        if cached_summary is not None:
            return self.impl.get_needed_blocks_one_step_cached(
                state, self._c_summary(cached_summary), two_steps_look_ahead, window_size
            )
        return self.impl.get_needed_blocks_one_step(
            state, _kvb_request(llm_request), two_steps_look_ahead, window_size
        )

    def get_remaining_blocks_to_completion(
        self, llm_request, window_size: int, cached_summary=None
    ) -> int:
        state = _state_of(llm_request)
        if cached_summary is not None:
            return self.impl.get_remaining_blocks_to_completion_cached(
                state, self._c_summary(cached_summary), window_size
            )
        return self.impl.get_remaining_blocks_to_completion(
            state, _kvb_request(llm_request), window_size
        )

    @staticmethod
    def _c_summary(summary: PrefixReuseSummary):
        c = _kvb.PrefixReuseSummary()
        c.reusable_blocks_allocated = summary.reusable_blocks_allocated
        c.reusable_blocks_all = summary.reusable_blocks_all
        c.first_new_block_index = -1 if summary.first_new_block is None else summary.first_new_block
        return c

    def commit_and_get_block_hashes_for_request(self, llm_request, window_size: int) -> List[int]:
        self.sync_tokens(llm_request)
        return self.impl.commit_block_hashes(llm_request.request_id, window_size)

    def probe_prefix_match_length(
        self, input_tokens, lora_task_id: Optional[int] = None, cache_salt: Optional[int] = None
    ) -> int:
        """Prefix tokens of ``input_tokens`` already cached here, in whole blocks (what a
        cache-aware attention-DP router compares between ranks). 0 without reuse, with several
        windows, or for an empty prompt. ``cache_salt`` is kvblock's salt id (an int: hash a
        string salt the way the requests' ``cache_salt_id`` is made)."""
        if not self.enable_block_reuse or self.is_variable_window or not input_tokens:
            return 0
        tokens = [int(t) for t in input_tokens]
        req = _kvb.Request(
            0,
            tokens,
            input_length=len(tokens),
            lora_task_id=lora_task_id,
            cache_salt=cache_salt,
        )
        blocks = self.impl.count_reusable_blocks(req, self._windows[0], False)
        return blocks * self.tokens_per_block

    def truncate_blocks(self, target_tokens, num_tokens_to_keep: int) -> None:
        self.impl.truncate_blocks(list(target_tokens), num_tokens_to_keep)

    def reset_reuse_state(self) -> None:
        self.impl.reset_reuse_state()

    # --- hybrid models: recurrent state -------------------------------------------------
    def copy_linear_attention_block(self, llm_request) -> bool:
        """Carries the request's recurrent state into its next block where its processed
        tokens end a block (TensorRT-LLM ``copyLinearAttentionBlock``): the context position
        during the prompt, all but the newest token after it. True when a copy was issued; a
        request the manager does not hold is skipped."""
        return self.copy_linear_attention_block_batch([llm_request])

    def copy_linear_attention_block_batch(self, llm_requests) -> bool:
        """The batch form, one submission for all (TensorRT-LLM
        ``copyLinearAttentionBlockBatch``); True when any copy was issued."""
        ids, positions = [], []
        for r in llm_requests:
            if not self._holds(r.request_id):
                continue
            finished = not r.is_context_init_state
            ids.append(r.request_id)
            positions.append(
                len(r.get_tokens(0)) - 1 if finished else r.context_current_position
            )
        return bool(ids) and self.impl.copy_recurrent_state(ids, positions) > 0

    # --- iteration and scheduling -------------------------------------------------------
    def refresh_blocks(self) -> None:
        self.impl.refresh_blocks()

    def flush_iteration_events(self) -> None:
        self.impl.flush_iteration_events()

    def sync_transfer_manager_with_buffer_manager(self) -> None:
        """kvblock enqueues its copies on the engine stream: nothing to order."""

    def get_latest_events(self, timeout_ms: Optional[int] = None):
        """Flushed events; ``None`` waits until there is one (at once when events are off)."""
        if timeout_ms is not None:
            return self.impl.get_latest_events(timeout_ms)
        while True:
            events = self.impl.get_latest_events(1000)
            if events or not self._config.max_kv_event_entries:
                return events

    def start_scheduling(self) -> None:
        self.impl.start_scheduling()

    def scheduling_remove_sequence(self, request_id: int) -> None:
        self.impl.scheduling_remove_sequence(request_id)

    def scheduling_has_free_blocks(self, num_required: int, window_size: int) -> bool:
        return self.impl.scheduling_has_free_blocks(num_required, window_size)

    def get_max_capacity_batch_size(self, input_length: int, output_length: int) -> int:
        return self.impl.get_max_capacity_batch_size(input_length, output_length)
