"""Calls on single blocks and on recurrent state from Python: onboard, pin and store by block id,
the recurrent-state copy of hybrid models, and the free-memory budget, each checked on the rows
the host backend really moves."""

from __future__ import annotations

import numpy as np
import pytest

import kvblock

TPB = 4
WINDOW = 64
CT, DT = kvblock.CacheType, kvblock.KvDataType


def manager(primary=4, secondary=4, layers=None):
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(WINDOW, primary, secondary, num_layers=1, num_kv_heads=2, size_per_head=8)],
        tokens_per_block=TPB,
        max_sequence_length=WINDOW,
        enable_block_reuse=True,
        bytes_per_element=2,
        copy_backend=kvblock.CopyBackend.HOST,
    )
    if layers:
        config.layers = layers
    return kvblock.KVCacheManager(config)


def cache_prompt(m, request_id, prompt):
    """Admits, computes and releases a prompt: its full blocks stay cached and free."""
    m.add_sequence(request_id, np.asarray(prompt, dtype=np.int32))
    ids = m.get_cache_block_ids(request_id, WINDOW)
    m.store_context_blocks(request_id, len(prompt))
    m.remove_sequence(request_id)
    return ids


def views_and_nine_tokens(m):
    """The GPU and host pool views, and the block ids of sequence 1 (9 tokens) just admitted."""
    m.add_sequence(1, np.arange(9, dtype=np.int32))
    view, host = m.pool_view(WINDOW), m.pool_view(WINDOW, kvblock.CacheLevel.SECONDARY)
    return view, host, m.get_cache_block_ids(1, WINDOW)


def test_onboard_block_brings_a_cached_host_block_back_with_its_bytes():
    with manager() as m:
        view, host, ids = views_and_nine_tokens(m)
        view[m.get_block_info(WINDOW, ids[1]).memory_index] = 42
        m.store_context_blocks(1, 9)
        m.remove_sequence(1)
        assert m.offload_block(WINDOW, ids[1])
        assert (host[m.get_block_info(WINDOW, ids[1]).memory_index] == 42).all()
        assert m.onboard_block(WINDOW, ids[1])
        info = m.get_block_info(WINDOW, ids[1])
        assert info.cache_level == kvblock.CacheLevel.PRIMARY and info.in_reuse_tree
        assert (view[info.memory_index] == 42).all()
        assert not m.onboard_block(WINDOW, ids[1])
        m.add_sequence(2, np.arange(9, dtype=np.int32))
        assert not m.onboard_block(WINDOW, ids[1])  # in use, on the GPU already
        with pytest.raises(kvblock.InvalidArgumentError):
            m.onboard_block(WINDOW, 1000)
        del view, host


def test_a_held_block_goes_to_the_host_tier_and_back_with_its_bytes():
    # TensorRT-LLM's offloadBlock / onboardBlock on a live sequence's block: the sequence keeps
    # it, the engine may read and write its host row, and its offsets wait for its return.
    with manager() as m:
        view, host, ids = views_and_nine_tokens(m)
        view[m.get_block_info(WINDOW, ids[0]).memory_index] = 7
        assert m.offload_block(WINDOW, ids[0])
        info = m.get_block_info(WINDOW, ids[0])
        assert (info.cache_level, info.ref_count) == (kvblock.CacheLevel.SECONDARY, 1)
        assert m.get_cache_block_ids(1, WINDOW) == ids
        assert (host[info.memory_index] == 7).all()
        host[info.memory_index] = 9
        max_blocks, pools = m.get_offset_table_dimensions()
        table = np.full((pools, 1, 2, max_blocks), -5, dtype=np.int32)
        with pytest.raises(kvblock.InvalidArgumentError, match="host tier"):
            m.copy_block_offsets(table, 0, 1)
        assert (table == -5).all()
        assert m.onboard_block(WINDOW, ids[0])
        info = m.get_block_info(WINDOW, ids[0])
        assert info.cache_level == kvblock.CacheLevel.PRIMARY
        assert (view[info.memory_index] == 9).all()
        assert m.copy_block_offsets(table, 0, 1) == 3
        m.check_invariants()
        del view, host


def test_pinned_blocks_are_not_evictable_until_unpinned():
    with manager(secondary=2) as m:
        ids = cache_prompt(m, 1, range(9))
        m.pin_blocks_by_id(WINDOW, ids[:2])
        assert m.get_num_free_blocks_per_window_size(WINDOW)[0] == 2
        assert not m.get_block_info(WINDOW, ids[0]).is_free
        m.unpin_blocks_by_id(WINDOW, ids[:2])
        assert m.get_block_info(WINDOW, ids[0]).is_free
        assert m.offload_block(WINDOW, ids[1])
        with pytest.raises(kvblock.InvalidArgumentError, match="host tier"):
            m.pin_blocks_by_id(WINDOW, [ids[0], ids[1]])
        assert m.get_block_info(WINDOW, ids[0]).ref_count == 0, "nothing pinned"


def test_store_blocks_makes_given_blocks_reusable():
    with manager(primary=8, secondary=0) as m:
        prompt = list(range(10))
        m.add_sequence(1, np.asarray(prompt, dtype=np.int32))
        ids = m.get_cache_block_ids(1, WINDOW)
        request = kvblock.Request(1, prompt)
        stored, pinned = m.store_blocks(request, 8, WINDOW, ids[:2], pin=True)
        assert (stored, pinned) == (2, ids[:2])
        assert m.get_block_info(WINDOW, ids[0]).ref_count == 2
        m.unpin_blocks_by_id(WINDOW, pinned)
        assert m.store_blocks(request, 8, WINDOW, ids[:2]) == (0, [])
        assert m.add_sequence(2, np.asarray(prompt, dtype=np.int32)).prepopulated_prompt_len == 8


def test_recurrent_state_moves_into_the_next_block_only_at_a_boundary():
    layers = [kvblock.LayerSpec(WINDOW, CT.SELF, 2, 8, DT.FP16),
              kvblock.LayerSpec(WINDOW, CT.RECURRENT_STATE, 4, 16, DT.FP32)]
    with manager(primary=8, secondary=0, layers=layers) as m:
        attention, state = m.model_pool_view(0), m.model_pool_view(1)
        m.add_sequence(1, np.arange(10, dtype=np.int32))
        rows = [m.get_block_info(WINDOW, b).memory_index for b in m.get_cache_block_ids(1, WINDOW)]
        for i, r in enumerate(rows):
            attention[r] = 10 + i
            state[r] = 100 + i
        assert m.copy_recurrent_state([1], [6]) == 0
        assert (state[rows[1]] == 101).all()
        assert m.copy_recurrent_state([1], [4]) == 1
        assert (state[rows[1]] == 100).all() and (state[rows[0]] == 100).all()
        assert (attention[rows[1]] == 11).all(), "attention rows are not state"
        with pytest.raises(kvblock.InvalidArgumentError):
            m.copy_recurrent_state([1, 99], [8, 8])
        assert (state[rows[2]] == 102).all(), "a failed call copies nothing"
        del attention, state


def test_free_memory_budget_checks_its_arguments_and_needs_cuda():
    with pytest.raises(kvblock.InvalidArgumentError):
        kvblock.KVCacheManager.calculate_free_mem_bytes(0, 1.0)
    try:
        gpu, host = kvblock.KVCacheManager.calculate_free_mem_bytes(0, 0.5, 0, 1 << 20)
    except kvblock.UnsupportedError as e:
        assert "CUDA" in str(e)
    else:
        assert host == 1 << 20 and gpu > 0


def test_set_block_priority_reorders_the_free_queue_and_refuses_out_of_range():
    m = manager(primary=4, secondary=0)
    ids = cache_prompt(m, 1, range(12))
    # The last cached block is lowered: the next allocation takes it before the others.
    m.set_block_priority(WINDOW, ids[2], 0)
    assert m.get_priority_by_block_id(WINDOW, ids[2]) == 0
    with pytest.raises(kvblock.InvalidRetentionError):
        m.set_block_priority(WINDOW, ids[2], 101)
    assert m.get_priority_by_block_id(WINDOW, ids[2]) == 0
    m.add_sequence(2, np.arange(100, 104, dtype=np.int32))
    assert m.get_cache_block_ids(2, WINDOW) == [ids[2]]
