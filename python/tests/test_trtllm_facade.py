"""kvblock.trtllm: the PyTorch executor's calls on TensorRT-LLM's manager binding, each checked
against kvblock's own API on the same scenario, and the rows where the two mean different
things."""

from __future__ import annotations

import numpy as np
import pytest

import kvblock
from kvblock.trtllm import KVCacheManager, LlmRequest

TPB = 4
WINDOW = 64
EXTRA = 1
DRAFT = 2


def make_facade(reuse: bool = True, events: int = 1000, windows=None) -> KVCacheManager:
    windows = windows or {WINDOW: (40, 8)}
    m = KVCacheManager(
        num_kv_heads_per_layer=[2] * len(windows),
        size_per_head=8,
        tokens_per_block=TPB,
        blocks_per_window=windows,
        max_num_sequences=8,
        max_beam_width=2,
        max_attention_window_vec=sorted(windows),
        max_sequence_length=max(windows) + EXTRA + DRAFT,
        enable_block_reuse=reuse,
        max_kv_event_entries=events,
        num_extra_kv_tokens=EXTRA,
        max_draft_tokens=DRAFT,
    )
    m.allocate_pools(False)
    return m


def make_twin(reuse: bool = True, events: int = 1000) -> kvblock.KVCacheManager:
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(WINDOW, 40, 8, num_layers=1, num_kv_heads=2, size_per_head=8)],
        tokens_per_block=TPB,
        max_beam_width=2,
        max_sequence_length=WINDOW,
        num_extra_kv_tokens=EXTRA,
        max_draft_tokens=DRAFT,
        enable_block_reuse=reuse,
        bytes_per_element=2,
        max_kv_event_entries=events,
    )
    return kvblock.KVCacheManager(config)


def run(m: KVCacheManager, req: LlmRequest, generated: list[int]) -> None:
    m.add_sequence_batch([(req.request_id, req.prompt_len, 1)], [req])
    req.context_current_position = req.prompt_len
    m.store_context_blocks(req)
    req.is_context_init_state = False
    req.is_generation_in_progress_state = True
    for token in generated:
        req.add_new_token(token)
        m.add_token(req.request_id)
        m.store_new_block(req)


def test_executor_iteration_matches_kvblock():
    f, k = make_facade(), make_twin()
    warm = LlmRequest.from_prompt(1, range(100, 112))
    run(f, warm, [900])
    f.remove_sequence(1, warm)
    k.add_sequence(kvblock.Request(1, list(range(100, 112))))
    k.store_context_blocks(1, 12)
    k.resize(1, 13)
    k.add_token(1, 900)
    k.store_new_block(1)
    k.remove_sequence(1, True)

    r2 = LlmRequest.from_prompt(2, list(range(100, 108)) + list(range(300, 305)), 8)
    r3 = LlmRequest.from_prompt(3, range(500, 509), 8)
    f.add_sequence_batch([(2, 13, 1), (3, 9, 1)], [r2, r3])
    admitted = k.add_sequence_batch(
        [kvblock.Request(2, r2.get_tokens(0)), kvblock.Request(3, r3.get_tokens(0))]
    )
    assert r2.prepopulated_prompt_len == admitted[0].prepopulated_prompt_len == 8
    assert r2.reused_blocks == admitted[0].stats.reused_blocks
    assert r3.missed_blocks == admitted[1].stats.missed_blocks
    for rid in (2, 3):  # the extra KV token
        f.add_token(rid)
        k.resize(rid, k.get_sequence_lengths(rid).capacity + 1)
    for _ in range(DRAFT):
        f.add_token(3)
    k.resize(3, k.get_sequence_lengths(3).capacity + DRAFT)
    for rid in (2, 3):
        assert f.get_token_count(rid) == k.get_sequence_lengths(rid).capacity
        assert f.get_cache_block_ids(rid, WINDOW) == [list(k.get_cache_block_ids(rid, WINDOW))]
    assert f.get_batch_cache_block_ids([2, 3], WINDOW)[1][0] == list(k.get_cache_block_ids(3, WINDOW))
    f.rewind_kv_cache(3, DRAFT)
    k.resize(3, k.get_sequence_lengths(3).capacity - DRAFT)
    assert f.get_token_count(3) == k.get_sequence_lengths(3).capacity

    stats = f.get_kv_cache_stats()
    ks = k.get_kv_cache_stats()
    assert (stats.free_num_blocks, stats.alloc_total_blocks, stats.reused_blocks) == (
        ks.free_num_blocks,
        ks.alloc_total_blocks,
        ks.reused_blocks,
    )
    assert stats.num_free_blocks_per_window_size == {WINDOW: ks.free_num_blocks}
    iteration = f.get_iteration_stats()[WINDOW]
    assert iteration.iter_alloc_total_blocks == ks.alloc_total_blocks
    f.flush_iteration_events()
    k.flush_iteration_events()
    fe, ke = f.get_latest_events(0), k.get_latest_events(0)
    assert [e.event_type for e in fe] == [e.event_type for e in ke]

    ids = f.get_cache_block_ids(2, WINDOW)[0]
    free = f.get_num_free_blocks()
    assert f.remove_sequence(2, r2, True) == ids[-1]
    assert f.get_num_free_blocks() == free  # pinned on release
    f.unpin_blocks_by_id(ids)
    assert f.get_num_free_blocks() == free + len(ids)
    assert f.remove_sequence(2) is None  # gone: a no-op, not an error
    with pytest.raises(kvblock.UnknownRequestError):
        k.remove_sequence(99)

    f.truncate_blocks(list(range(100, 112)), TPB)
    probe = kvblock.Request(9, list(range(100, 113)))
    assert f.impl.count_reusable_blocks(probe, WINDOW) == 1
    f.reset_reuse_state()
    assert f.impl.count_reusable_blocks(probe, WINDOW) == 0
    f.impl.check_invariants()


def test_priority_takes_block_then_window():
    f = make_facade()
    req = LlmRequest.from_prompt(1, range(10, 19))
    f.add_sequence_batch([(1, 9, 1)], [req])
    block = f.get_cache_block_ids(1, WINDOW)[0][0]
    assert f.get_priority_by_block_id(block, WINDOW) == f.impl.get_priority_by_block_id(WINDOW, block)


def test_add_token_reserves_a_slot_and_takes_the_token_later():
    f = make_facade()
    req = LlmRequest.from_prompt(1, range(10, 18))
    f.add_sequence_batch([(1, 8, 1)], [req])
    f.add_token(1)
    assert f.get_token_count(1) == 9
    assert f.impl.get_num_tokens(1) == 8
    req.add_new_token(42)
    f.sync_tokens(req)
    assert f.impl.get_num_tokens(1) == 9


def test_cache_block_ids_are_per_beam():
    f = make_facade()
    req = LlmRequest.from_prompt(1, range(10, 20))
    f.add_sequence_batch([(1, 10, 2)], [req])
    per_beam = f.get_cache_block_ids(1, WINDOW)
    assert len(per_beam) == 2
    assert per_beam[1] == list(f.impl.get_cache_block_ids(1, WINDOW, 1))


def test_add_token_with_beam_search_takes_a_block_per_beam_at_a_boundary():
    f = make_facade()
    req = LlmRequest.from_prompt(1, range(10, 10 + TPB + 2))
    f.add_sequence_batch([(1, TPB + 2, 2)], [req])
    free = f.get_num_free_blocks()
    for _ in range(TPB - 2):
        f.add_token(1)
    assert f.get_num_free_blocks() == free
    f.add_token(1)
    assert f.get_num_free_blocks() == free - 2
    beams = f.get_cache_block_ids(1, WINDOW)
    assert beams[0][0] == beams[1][0] and beams[0][2] != beams[1][2]
    f.remove_sequence(1)
    assert f.get_num_free_blocks() == free + 3


def test_analyze_prefix_reuse_and_cached_estimates():
    f = make_facade()
    holder = LlmRequest.from_prompt(1, range(10, 27))
    run(f, holder, [])
    f.store_blocks_for_reuse(1, holder)
    probe = LlmRequest.from_prompt(2, list(range(10, 22)) + list(range(90, 96)))
    summary = f.analyze_prefix_reuse(probe.get_tokens(0), probe)
    assert (summary.reusable_blocks_all, summary.reusable_blocks_allocated) == (3, 3)
    assert summary.first_new_block == 3
    walked = f.get_needed_blocks_one_step(probe, False, WINDOW)
    assert walked == f.get_needed_blocks_one_step(probe, False, WINDOW, summary) == 2
    assert f.get_remaining_blocks_to_completion(probe, WINDOW) == (
        f.get_remaining_blocks_to_completion(probe, WINDOW, summary)
    )
    # kvblock's own call takes the C order: state, request, two_steps, window.
    state = kvblock.RequestState(2, prompt_len=18, context_chunk_size=18)
    assert f.impl.get_needed_blocks_one_step(state, kvblock.Request(2, probe.get_tokens(0)), False, WINDOW) == 2


def test_a_chunk_size_counts_a_chunks_tokens_past_a_sliding_window():
    # Window 128, 64-token blocks, a 1024-token prompt and 128 new tokens: the whole prompt and
    # a block for the slide; given the chunk size, all 1152 tokens (TensorRT-LLM's temporary
    # attention window).
    def remaining(chunk_size: int) -> int:
        m = KVCacheManager(
            num_kv_heads_per_layer=[1],
            size_per_head=1,
            tokens_per_block=64,
            blocks_per_window={128: (40, 0)},
            max_num_sequences=8,
            max_beam_width=1,
            max_attention_window_vec=[128],
            max_sequence_length=16384,
            chunk_size=chunk_size,
        )
        m.allocate_pools(False)
        req = LlmRequest.from_prompt(1, range(1024), max_new_tokens=128)
        return m.get_remaining_blocks_to_completion(req, 128)

    assert remaining(0) == 17
    assert remaining(16384) == 18


def test_stats_are_writable_and_iteration_stats_are_deltas():
    f = make_facade()
    f.get_iteration_stats()
    req = LlmRequest.from_prompt(1, range(10, 23))
    run(f, req, [])
    f.remove_sequence(1, req)
    s = f.get_iteration_stats()[WINDOW]
    assert (s.iter_alloc_total_blocks, s.primary_peak_used_blocks, s.primary_evictable_blocks) == (4, 4, 3)
    assert f.get_iteration_stats()[WINDOW].iter_alloc_total_blocks == 0
    stats = f.get_kv_cache_stats()
    stats.reused_blocks = 7  # the executor adjusts these
    assert stats.reused_blocks == 7


def test_committed_hashes_and_lookups_by_key():
    f = make_facade()
    req = LlmRequest.from_prompt(1, range(10, 23))
    f.add_sequence_batch([(1, 13, 1)], [req])
    f.impl.advance_history(1, 13)
    hashes = f.commit_and_get_block_hashes_for_request(req, WINDOW)
    assert len(hashes) == 3
    f.flush_iteration_events()
    stored = [b.block_hash for e in f.get_latest_events(0) for b in e.stored_blocks]
    assert hashes == stored
    ids = f.get_cache_block_ids(1, WINDOW)[0]
    found = f.impl.find_blocks_in_reuse_tree(kvblock.Request(9, list(range(10, 22))), 12, WINDOW)
    assert found == ids[:3]
    rows = f.get_memory_pool_block_indices(ids, WINDOW)
    assert rows == [f.impl.get_block_info(WINDOW, b).memory_index for b in ids]


def test_add_token_slides_the_window_before_the_token_arrives():
    # The window of 8 keeps the configured draft tokens (2) of blocks past it: the first block
    # leaves once 8 + 4 + 2 = 14 slots are reserved, at add_token, with no token handed over.
    f = make_facade(windows={8: (10, 0), 64: (10, 0)})
    req = LlmRequest.from_prompt(1, range(10, 21))
    f.add_sequence_batch([(1, 11, 1)], [req])
    free = f.get_num_free_blocks_per_window_size()
    for token in (21, 22):
        req.add_new_token(token)
        f.add_token(1)
    assert f.get_num_front_blocks_removed(1, 8) == 0
    req.add_new_token(23)
    f.add_token(1)
    assert f.get_token_count(1) == 14
    assert f.get_num_front_blocks_removed(1, 8) == 1
    assert f.get_num_front_blocks_removed(1, 64) == 0
    now = f.get_num_free_blocks_per_window_size()
    # 14 slots take a fourth block in both windows; the window of 8 got its first block back.
    assert now[8] == free[8] and now[64] == free[64] - 1
    f.impl.check_invariants()


def test_configuration_queries_and_pools():
    f = make_facade(reuse=False, windows={16: (20, 0), 64: (20, 0)})
    assert f.is_variable_window
    assert (f.first_window_size, f.last_window_size) == (16, 64)
    assert not f.enable_block_reuse and f.enable_partial_reuse and not f.cross_kv
    assert f.num_pools == 2
    assert f.max_blocks_per_seq == f.impl.get_offset_table_dimensions()[0]
    req = LlmRequest.from_prompt(1, range(10, 26))
    run(f, req, list(range(100, 110)))
    assert f.get_num_front_blocks_removed(1, 16) > 0
    assert f.get_num_front_blocks_removed(1, 64) == 0
    f.release_pools()
    with pytest.raises(kvblock.InvalidArgumentError):
        f.get_num_free_blocks()


def test_copy_batch_block_offsets_takes_a_slot_offset():
    f = make_facade()
    a = LlmRequest.from_prompt(1, range(10, 19))
    b = LlmRequest.from_prompt(2, range(40, 45))
    f.add_sequence_batch([(1, 9, 1), (2, 5, 1)], [a, b])
    shape = (f.num_pools, 6, 2, f.max_blocks_per_seq)
    batch = np.full(shape, -7, dtype=np.int32)
    f.copy_batch_block_offsets(batch, [1, 2], 1, 3)
    one = np.full(shape, -7, dtype=np.int32)
    f.copy_block_offsets(one, 3, 1)
    f.copy_block_offsets(one, 4, 2)
    assert np.array_equal(batch, one)


def test_latest_events_without_timeout_returns_with_events_off():
    assert make_facade(events=0).get_latest_events() == []


def pool_facade(heads, windows, **kw) -> KVCacheManager:
    m = KVCacheManager(
        num_kv_heads_per_layer=heads,
        size_per_head=kw.pop("size_per_head", 8),
        tokens_per_block=TPB,
        blocks_per_window=windows,
        max_num_sequences=8,
        max_beam_width=1,
        max_attention_window_vec=sorted(windows),
        max_sequence_length=max(windows),
        enable_block_reuse=True,
        copy_backend=kvblock.CopyBackend.HOST,
        **kw,
    )
    m.allocate_pools(False)
    return m


def test_per_layer_heads_group_into_pools_as_tensorrt_llm_does():
    # Layers 0, 2 have 2 heads and layer 1 has 4 (one window): two pools, layer -> (pool, index).
    f = pool_facade([2, 4, 2], {WINDOW: (16, 4)}, dtype_bytes=2)
    infos = f.pool_configurations
    assert [i.num_kv_heads for i in infos] == sorted(i.num_kv_heads for i in infos)
    mapping = f.get_layer_to_pool_mapping()
    assert mapping.shape == (3, 2) and mapping.dtype == np.int32
    heads = [infos[p].num_kv_heads for p in mapping[:, 0]]
    assert heads == [2, 4, 2]
    assert sorted(mapping[[0, 2], 1].tolist()) == [0, 1] and mapping[1, 1] == 0
    pointers = f.get_block_pool_pointers()
    assert pointers.shape == (2, 2) and (pointers != 0).all()
    for p in range(2):
        assert pointers[p, 0] == f.impl.get_model_pool_pointer(p)[0]
    # The pool a layer reads is the view get_primary_pool_data gives: a token written at the
    # offset table's slab is found there by the layer's pool and index.
    view = f.get_primary_pool_data(1)
    assert view.shape[1:4] == (1, 2, 4)  # one 4-head layer, K|V
    with pytest.raises(kvblock.UnsupportedError):
        f.get_unique_primary_pool()
    assert f.get_block_scale_pool_pointers().tolist() == [[0, 0], [0, 0]]


def test_k_only_cross_and_quantized_caches():
    from kvblock.trtllm import CacheType

    mla = pool_facade([1, 1], {WINDOW: (16, 4)}, size_per_head=576, cache_type=CacheType.SELFKONLY,
                      kv_data_type=kvblock.KvDataType.BF16)
    (info,) = mla.pool_configurations
    assert (info.kv_factor, info.num_layers, info.cache_type) == (1, 2, kvblock.CacheType.SELF_K_ONLY)
    assert mla.get_unique_primary_pool().shape[2] == 1  # no V half
    cross = pool_facade([2], {WINDOW: (16, 4)}, cache_type=CacheType.CROSS)
    assert cross.cross_kv and not mla.cross_kv
    fp4 = pool_facade([2, 2], {WINDOW: (16, 4)}, size_per_head=16, kv_data_type=kvblock.KvDataType.NVFP4)
    scales = fp4.get_block_scale_pool_pointers()
    assert scales.shape == (1, 2) and scales[0, 0] != 0
    uniform = pool_facade([2, 2], {WINDOW: (16, 4)})
    assert uniform.get_block_pool_pointers()[0, 0] == uniform.impl.get_pool_pointer(WINDOW, kvblock.CacheLevel.PRIMARY)[0]


def test_the_indexer_k_cache_is_a_pool_after_the_kv_pools():
    from kvblock.trtllm import CacheType

    def make(indexer):
        return pool_facade([1, 1, 1], {WINDOW: (16, 4)}, size_per_head=576, cache_type=CacheType.SELFKONLY,
                           kv_data_type=kvblock.KvDataType.BF16, enable_indexer_k_cache=indexer,
                           indexer_k_cache_index_head_dim=128, indexer_k_cache_quant_block_size=128,
                           indexer_k_cache_layer_mask=[True, False, True])

    plain, f = make(False), make(True)
    assert not plain.enable_indexer_k_cache and f.enable_indexer_k_cache
    assert (f.indexer_k_cache_index_head_dim, f.indexer_k_cache_quant_block_size) == (128, 128)
    assert f.get_layer_to_pool_mapping().tolist() == plain.get_layer_to_pool_mapping().tolist()
    assert f.get_block_pool_pointers().shape == (2, 2)  # the latent pool, then the indexer's
    pool = f.get_indexer_k_cache_pool()
    assert pool.shape == (16, 2, 1, 1, TPB, 132)  # two layers keep an indexer
    data = f.get_indexer_k_cache_pool_data(1)
    assert data.shape == (16, TPB * 132)
    data[3] = 7  # a view: the pool sees it
    assert (pool[3, 1] == 7).all() and not (pool[3, 0] == 7).all()
    with pytest.raises(kvblock.UnsupportedError):
        plain.get_indexer_k_cache_pool()
    with pytest.raises(kvblock.InvalidConfigError):
        pool_facade([1], {WINDOW: (16, 4)}, enable_indexer_k_cache=True, indexer_k_cache_index_head_dim=100)


def test_probe_prefix_match_length_counts_cached_whole_blocks():
    m = make_facade()
    prompt = list(range(10, 23))
    r = LlmRequest.from_prompt(1, prompt, max_new_tokens=2)
    m.add_sequence_batch([(1, r.prompt_len, 1)], [r])
    r.context_current_position = r.prompt_len
    m.store_context_blocks(r)
    m.remove_sequence(1, r)
    assert m.probe_prefix_match_length(prompt) == 12
    req = kvblock.Request(0, prompt, input_length=len(prompt))
    assert m.probe_prefix_match_length(prompt) == m.impl.count_reusable_blocks(req, WINDOW, False) * TPB
    assert m.probe_prefix_match_length(prompt[:6]) == 4
    assert m.probe_prefix_match_length(prompt, lora_task_id=7) == 0, "another LoRA's keys"
    assert m.probe_prefix_match_length(prompt, cache_salt=3) == 0, "another salt's keys"
    assert m.probe_prefix_match_length([]) == 0
    assert make_facade(reuse=False).probe_prefix_match_length(prompt) == 0


def test_copy_linear_attention_block_carries_the_recurrent_state():
    CT, DT = kvblock.CacheType, kvblock.KvDataType
    m = KVCacheManager(
        num_kv_heads_per_layer=[2],
        size_per_head=8,
        tokens_per_block=TPB,
        blocks_per_window={WINDOW: (12, 0)},
        max_num_sequences=4,
        max_beam_width=1,
        max_attention_window_vec=[WINDOW],
        max_sequence_length=WINDOW,
        copy_backend=kvblock.CopyBackend.HOST,
        extra_layers=[kvblock.LayerSpec(WINDOW, CT.RECURRENT_STATE, 2, 16, DT.FP32)],
    )
    m.allocate_pools(False)
    state = m.impl.model_pool_view(1)
    a = LlmRequest.from_prompt(1, list(range(10)), max_new_tokens=4)
    b = LlmRequest.from_prompt(2, list(range(100, 108)), max_new_tokens=4)
    m.add_sequence_batch([(1, 10, 1), (2, 8, 1)], [a, b])
    rows = {r.request_id: [m.impl.get_block_info(WINDOW, x).memory_index
                           for x in m.get_cache_block_ids(r.request_id, WINDOW)[0]] for r in (a, b)}
    for rid, rs in rows.items():
        for i, row in enumerate(rs):
            state[row] = 10 * rid + i
    a.context_current_position = 6
    assert not m.copy_linear_attention_block(a)
    a.context_current_position = 4
    assert m.copy_linear_attention_block(a)
    assert (state[rows[1][1]] == 10).all()
    # b finished its prompt and generated a token: 8 of its 9 tokens are processed.
    b.is_context_init_state = False
    b.is_generation_in_progress_state = True
    b.add_new_token(5)
    m.add_token(2)
    m.sync_tokens(b)
    rows[2] = [m.impl.get_block_info(WINDOW, x).memory_index
               for x in m.get_cache_block_ids(2, WINDOW)[0]]
    state[rows[2][2]] = 99
    stranger = LlmRequest.from_prompt(7, [1, 2, 3, 4])
    assert m.copy_linear_attention_block_batch([a, b, stranger])
    assert (state[rows[2][2]] == 21).all()
    assert not m.copy_linear_attention_block_batch([stranger])
    del state


class _Connector:
    """TensorRT-LLM's KV-cache connector shape: how many prompt tokens past the reused prefix an
    external store loads."""

    def __init__(self, tokens, fail_on=None):
        self.tokens, self.fail_on, self.asked = tokens, fail_on, []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.asked.append((request.request_id, num_computed_tokens))
        if request.request_id == self.fail_on:
            raise RuntimeError("store unreachable")
        return self.tokens


def make_connected(connector) -> KVCacheManager:
    m = KVCacheManager(
        num_kv_heads_per_layer=[2],
        size_per_head=8,
        tokens_per_block=TPB,
        blocks_per_window={WINDOW: (16, 0)},
        max_num_sequences=8,
        max_beam_width=1,
        max_attention_window_vec=[WINDOW],
        max_sequence_length=WINDOW,
        enable_block_reuse=True,
        kv_connector_manager=connector,
    )
    m.allocate_pools(False)
    return m


def test_a_connectors_tokens_after_the_reused_prefix_are_prepopulated():
    connector = _Connector(4)
    m = make_connected(connector)
    first = LlmRequest.from_prompt(1, range(9))
    run(m, first, [])
    m.remove_sequence(1, first)
    again = LlmRequest.from_prompt(2, range(20))
    m.add_sequence_batch([(2, 20, 1)], [again])
    assert connector.asked[-1] == (2, 2 * TPB), "asked after the tree's match"
    assert again.prepopulated_prompt_len == 2 * TPB + 4
    capped = LlmRequest.from_prompt(3, range(100, 106))
    m.add_sequence_batch([(3, 6, 1)], [capped])
    assert capped.prepopulated_prompt_len == 4


def test_a_connector_that_raises_admits_nothing():
    m = make_connected(_Connector(2, fail_on=7))
    free = m.get_num_free_blocks()
    ok, failing = LlmRequest.from_prompt(1, range(6)), LlmRequest.from_prompt(7, range(50, 56))
    with pytest.raises(RuntimeError):
        m.add_sequence_batch([(1, 6, 1), (7, 6, 1)], [ok, failing])
    assert m.get_num_free_blocks() == free
    with pytest.raises(kvblock.UnknownRequestError):
        m.impl.get_sequence_lengths(1)  # the whole batch was refused
